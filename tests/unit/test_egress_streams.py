"""Egress streams the agent opens, served in memory (no Docker, no sockets on the sandbox
side): a scripted agent (tests/agent_peer.py, an independent codec) opens `egress` streams on
a real server Channel, which routes them to a session's proxy through
sandboxd.agent.egress_route. What is checked: HELLO's egress_port, who is refused and how,
flow control both ways (a proxy that does not read stalls only its own stream, within one
window), half-close, CLOSE, RESET and the epoch's end, and the proxy's checks and quotas over
such a stream: hostile CONNECT heads, the connection quota, the byte quota."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import struct
from collections.abc import AsyncIterator

import agent_wire as w
import pytest
from agent_peer import ScriptedAgent
from sandboxd.agent.channel import Channel
from sandboxd.agent.egress_route import EgressAcceptor, peer_open_handler
from sandboxd.egress.addresses import Protected
from sandboxd.egress.audit import AuditLog
from sandboxd.egress.policy import DEFAULT_QUOTAS, ResolvedQuotas
from sandboxd.egress.proxy import EgressProxy, Rules
from sandboxd.egress.resolver import Resolver

WINDOW = 4096
SESSION = "s-1"


class Endpoints:
    def __init__(self, acceptor: EgressAcceptor | None) -> None:
        self.acceptor_ = acceptor

    def egress_port(self, session_id: str) -> int:
        return 3128 if session_id == SESSION and self.acceptor_ else 0

    def acceptor(self, session_id: str) -> EgressAcceptor | None:
        return self.acceptor_ if session_id == SESSION else None


class Sink:
    """An acceptor that keeps the connections it is given, for the test to drive."""

    read_limit = 1024

    def __init__(self) -> None:
        self.accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.Queue()
        )

    def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted.put_nowait((reader, writer))

    async def next(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(self.accepted.get(), 2)


@contextlib.asynccontextmanager
async def channel_for(
    acceptor: EgressAcceptor | None, session_id: str = SESSION
) -> AsyncIterator[tuple[ScriptedAgent, Channel, dict[str, object]]]:
    agent = ScriptedAgent()
    endpoints = Endpoints(acceptor)
    channel = Channel(
        agent.transport,  # type: ignore[arg-type]
        name="egress",
        window=WINDOW,
        handshake_s=2.0,
        resend_s=0.05,
        egress_port=endpoints.egress_port(session_id),
        on_peer_open=peer_open_handler(endpoints, session_id),
    )
    starting = asyncio.create_task(channel.start())
    hello = await agent.handshake()
    await starting
    try:
        yield agent, channel, hello
    finally:
        await channel.close()


def open_egress(agent: ScriptedAgent, sid: int, kind: str = "egress") -> None:
    agent.send_json(w.OPEN, sid, {"kind": kind, "peer": "127.0.0.1:40000"})


async def frames_of(agent: ScriptedAgent, sid: int, until: int, timeout: float = 2.0) -> list:  # type: ignore[type-arg]
    """Frames of stream `sid` up to the first of type `until` (others skipped)."""
    got = []
    while True:
        f = await agent.recv(timeout)
        if f.stream != sid:
            continue
        got.append(f)
        if f.type == until:
            return got


def sent_data(frames: list) -> bytes:  # type: ignore[type-arg]
    return b"".join(f.data for f in frames if f.type == w.DATA)


# ----- routing ---------------------------------------------------------------------------------


async def test_hello_carries_the_egress_port_only_for_a_session_with_a_proxy() -> None:
    async with channel_for(Sink()) as (_, _, hello):
        assert hello["egress_port"] == 3128
    async with channel_for(None) as (_, _, hello):
        assert hello["egress_port"] == 0
    async with channel_for(Sink(), session_id="") as (_, _, hello):  # a pool member
        assert hello["egress_port"] == 0


@pytest.mark.parametrize("session_id", ["", "another-session"])
async def test_a_session_without_allowlist_gets_reset_refused(session_id: str) -> None:
    sink = Sink()
    async with channel_for(sink, session_id=session_id) as (agent, channel, _):
        open_egress(agent, 2)
        reset = await agent.recv_type(w.RESET)
        doc = reset.json()
        assert reset.stream == 2 and doc["error"] == "REFUSED"
        assert "no ALLOWLIST network policy" in doc["message"]
        assert sink.accepted.empty() and channel.open_streams == 0


async def test_other_kinds_and_reopened_ids_are_refused() -> None:
    sink = Sink()
    async with channel_for(sink) as (agent, channel, _):
        open_egress(agent, 2, kind="exec")
        reset = await agent.recv_type(w.RESET)
        assert (reset.stream, reset.json()["error"]) == (2, "INVALID")
        agent.send(w.encode(w.OPEN, 4, b"{not json"))
        reset = await agent.recv_type(w.RESET)
        assert (reset.stream, reset.json()["error"]) == (4, "PROTOCOL")
        open_egress(agent, 6)
        assert (await agent.recv_type(w.OPEN_OK)).stream == 6
        open_egress(agent, 6)  # the same id again
        reset = await agent.recv_type(w.RESET)
        assert (reset.stream, reset.json()["error"]) == (6, "PROTOCOL")
        reader, writer = await sink.next()
        assert writer.get_extra_info("peername") == ("127.0.0.1", 40000)
        assert writer.get_extra_info("session_id") == SESSION
        # The stream opened twice was reset as a whole; no second connection was made.
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), 2)
        assert sink.accepted.empty() and channel.open_streams == 0


# ----- the byte stream ---------------------------------------------------------------------------


async def test_bytes_both_ways_half_close_and_close() -> None:
    sink = Sink()
    async with channel_for(sink) as (agent, channel, _):
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        reader, writer = await sink.next()
        agent.send(w.data(2, b"hello "))
        agent.send(w.data(2, b"proxy"))
        agent.send(w.encode(w.EOF, 2, b"\x00"))  # the sandbox half-closed
        assert await asyncio.wait_for(reader.read(), 2) == b"hello proxy"
        writer.write(b"answer")
        writer.write_eof()
        got = await frames_of(agent, 2, w.EOF)
        assert sent_data(got) == b"answer" and got[-1].payload == b"\x00"
        writer.close()
        assert (await agent.recv_type(w.CLOSE)).stream == 2
        await writer.wait_closed()
        assert channel.open_streams == 0


async def test_reset_by_the_agent_is_a_reset_connection() -> None:
    sink = Sink()
    async with channel_for(sink) as (agent, channel, _):
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        reader, writer = await sink.next()
        agent.send_json(w.RESET, 2, {"error": "IO", "message": "socket error"})
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), 2)
        assert channel.open_streams == 0
        writer.write(b"dropped")  # as on a reset socket: nothing raises, nothing is sent
        await asyncio.sleep(0.05)
        assert not [f for f in agent.pending() if f.stream == 2]


async def test_the_epoch_ending_cuts_the_connection() -> None:
    sink = Sink()
    async with channel_for(sink) as (agent, _, _):
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        reader, _ = await sink.next()
        agent.send_json(w.GOAWAY, 0, {"error": "X", "message": "bye"})
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), 2)


async def test_a_server_side_that_does_not_read_withholds_the_window() -> None:
    sink = Sink()
    async with channel_for(sink) as (agent, channel, _):
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        reader, _ = await sink.next()
        # The agent may send one window; the reader (limit 1024) pauses, so no WINDOW comes.
        for _ in range(WINDOW // 1024):
            agent.send(w.data(2, b"x" * 1024))
        await asyncio.sleep(0.1)
        grants = [f for f in agent.pending() if f.type == w.WINDOW and f.stream == 2]
        assert sum(struct.unpack(">I", f.payload)[0] for f in grants) <= 2 * 1024 + WINDOW // 2
        # More than the window is the agent's fault: that stream alone is reset.
        agent.send(w.data(2, b"y" * (WINDOW + 1)))
        reset = await agent.recv_type(w.RESET)
        assert (reset.stream, reset.json()["error"]) == (2, "FLOW_CONTROL")
        # The channel goes on: a new stream opens.
        open_egress(agent, 4)
        assert (await agent.recv_type(w.OPEN_OK)).stream == 4
        assert channel.open_streams == 1
        del reader


async def test_reading_gives_the_window_back() -> None:
    sink = Sink()
    async with channel_for(sink) as (agent, _, _):
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        reader, _ = await sink.next()
        total = 0
        for _ in range(4):  # four windows' worth, sent as the grants come
            agent.send(w.data(2, b"z" * WINDOW))
            got = await asyncio.wait_for(reader.readexactly(WINDOW), 2)
            total += len(got)
            granted = 0
            while granted < WINDOW:
                f = await agent.recv_type(w.WINDOW)
                granted += struct.unpack(">I", f.payload)[0]
        assert total == 4 * WINDOW


async def test_writes_wait_for_the_agents_window() -> None:
    sink = Sink()
    async with channel_for(sink) as (agent, _, _):
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        _, writer = await sink.next()
        writer.write(b"a" * (3 * WINDOW))
        draining = asyncio.create_task(writer.drain())
        await asyncio.sleep(0.1)
        first = [f for f in agent.pending() if f.type == w.DATA]
        assert sum(len(f.data) for f in first) == WINDOW  # no more than the window
        agent.send(w.window(2, 2 * WINDOW))
        rest = await frames_of(agent, 2, w.DATA)
        while sum(len(f.data) for f in first + rest) < 3 * WINDOW:
            rest += await frames_of(agent, 2, w.DATA)
        await asyncio.wait_for(draining, 2)
        writer.close()


async def test_data_held_while_reading_is_paused_survives_a_clean_close() -> None:
    sink = Sink()
    async with channel_for(sink) as (agent, channel, _):
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        reader, writer = await sink.next()
        writer.transport.pause_reading()  # as start_tls does before its handshake
        agent.send(w.data(2, b"held "))
        agent.send(w.data(2, b"bytes"))
        agent.send(w.encode(w.EOF, 2, b"\x00"))
        agent.send(w.encode(w.CLOSE, 2))
        await asyncio.sleep(0.05)
        assert reader._buffer == b""  # type: ignore[attr-defined]  # nothing delivered yet
        assert channel.open_streams == 0  # the channel is done with it
        writer.transport.resume_reading()
        assert await asyncio.wait_for(reader.read(), 2) == b"held bytes"


async def test_closing_while_data_is_held_after_a_clean_end_completes() -> None:
    sink = Sink()
    async with channel_for(sink) as (agent, _, _):
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        _, writer = await sink.next()
        writer.transport.pause_reading()
        agent.send(w.data(2, b"never read"))
        agent.send(w.encode(w.CLOSE, 2))
        await asyncio.sleep(0.05)
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 2)


class Exploding(asyncio.Protocol):
    def data_received(self, data: bytes) -> None:
        raise RuntimeError("a protocol bug")


async def test_a_failing_protocol_resets_its_stream_only() -> None:
    sink = Sink()
    async with channel_for(sink) as (agent, channel, _):
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        _, writer = await sink.next()
        writer.transport.set_protocol(Exploding())
        agent.send(w.data(2, b"boom"))
        reset = await agent.recv_type(w.RESET)
        assert (reset.stream, reset.json()["error"]) == (2, "ABORTED")
        open_egress(agent, 4)  # the channel's reader lives on
        assert (await agent.recv_type(w.OPEN_OK)).stream == 4
        assert channel.open_streams == 1


class Buffered(asyncio.BufferedProtocol):
    """What start_tls puts on a transport (asyncio's SSLProtocol is a buffered protocol)."""

    def __init__(self) -> None:
        self.buf = bytearray(8)
        self.got = bytearray()
        self.eof = False

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        self.got += self.buf[:nbytes]

    def eof_received(self) -> bool:
        self.eof = True
        return True


async def test_a_buffered_protocol_gets_data_and_eof() -> None:
    sink = Sink()
    async with channel_for(sink) as (agent, channel, _):
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        _, writer = await sink.next()
        proto = Buffered()
        writer.transport.set_protocol(proto)
        agent.send(w.data(2, b"more than eight bytes"))
        agent.send(w.encode(w.EOF, 2, b"\x00"))
        open_egress(agent, 4)
        assert (await agent.recv_type(w.OPEN_OK)).stream == 4  # the reader went on
        assert proto.got == b"more than eight bytes" and proto.eof
        assert channel.open_streams == 2


class Failing:
    read_limit = 1024

    def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise RuntimeError("an acceptor bug")


async def test_a_failing_acceptor_resets_its_stream_only() -> None:
    async with channel_for(Failing()) as (agent, channel, _):
        open_egress(agent, 2)
        assert (await agent.recv_type(w.OPEN_OK)).stream == 2
        reset = await agent.recv_type(w.RESET)
        assert (reset.stream, reset.json()["error"]) == (2, "ABORTED")
        open_egress(agent, 4)
        assert (await agent.recv_type(w.OPEN_OK)).stream == 4  # the reader went on
        await asyncio.sleep(0.01)
        assert channel.state.value == "ready"


# ----- the proxy over a stream -----------------------------------------------------------------


def quotas(**changes: object) -> ResolvedQuotas:
    return dataclasses.replace(ResolvedQuotas.of(DEFAULT_QUOTAS), **changes)  # type: ignore[arg-type]


class Upstream:
    """A loopback echo server that counts connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Upstream:
        async def echo(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
            self.connections += 1
            while data := await r.read(65536):
                wr.write(data)
                await wr.drain()
            wr.close()

        self._server = await asyncio.start_server(echo, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()


@contextlib.asynccontextmanager
async def proxy_channel(
    port: int, **changes: object
) -> AsyncIterator[tuple[ScriptedAgent, EgressProxy]]:
    proxy = EgressProxy(
        SESSION,
        Rules(("up.test",), frozenset({port}), allow_private_networks=True),
        quotas(**changes),
        Resolver({"up.test": ("127.0.0.1",)}),
        AuditLog(SESSION),
        protected=Protected(host_addresses=frozenset, always=()),  # upstreams on loopback
    )
    try:
        async with channel_for(proxy) as (agent, _, _):
            yield agent, proxy
    finally:
        await proxy.close()


async def ask(agent: ScriptedAgent, sid: int, head: bytes) -> bytes:
    """Send `head` on a new egress stream; what the proxy answers until it ends its side."""
    open_egress(agent, sid)
    assert (await agent.recv_type(w.OPEN_OK)).stream == sid
    for i in range(0, len(head), 1000):
        agent.send(w.data(sid, head[i : i + 1000]))
    agent.send(w.encode(w.EOF, sid, b"\x00"))  # as `nc` does after its input
    got = await frames_of(agent, sid, w.CLOSE, timeout=5)
    return sent_data(got)


@pytest.mark.parametrize(
    ("head", "reason"),
    [
        (b"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n", "IP_LITERAL"),
        (b"CONNECT 2130706433:{port} HTTP/1.1\r\n\r\n", "IP_LITERAL"),
        (b"CONNECT [::ffff:7f00:1]:{port} HTTP/1.1\r\n\r\n", "IP_LITERAL"),
        (b"CONNECT other.test:{port} HTTP/1.1\r\n\r\n", "NAME_NOT_ALLOWED"),
        (b"CONNECT up.test:1 HTTP/1.1\r\n\r\n", "PORT_NOT_ALLOWED"),
        (b"CONNECT up.test:{port} HTTP/1.1\n\n", "MALFORMED_REQUEST"),
        (b"CONNECT up.test:{port} HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", ""),
        (b"GET http://up.test:{port}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", ""),
    ],
)
async def test_hostile_heads_over_a_stream_never_dial(head: bytes, reason: str) -> None:
    async with Upstream() as up, proxy_channel(up.port, header_timeout_s=1.0) as (agent, proxy):
        answer = await ask(agent, 2, head.replace(b"{port}", str(up.port).encode()))
        assert answer.startswith(b"HTTP/1.1 4") or answer.startswith(b"HTTP/1.1 5"), answer
        assert b"Connection: close" in answer
        if reason:
            assert f"X-Sandboxd-Egress-Reason: {reason}".encode() in answer
        assert up.connections == 0
        assert not proxy.audit.events()[-1].allowed


async def test_a_tunnel_over_a_stream_and_its_audit() -> None:
    async with Upstream() as up, proxy_channel(up.port) as (agent, proxy):
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        agent.send(w.data(2, f"CONNECT up.test:{up.port} HTTP/1.1\r\n\r\nping".encode()))
        got = b""
        while not got.endswith(b"ping"):
            got += sent_data(await frames_of(agent, 2, w.DATA))
        assert got.startswith(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        agent.send(w.encode(w.EOF, 2, b"\x00"))
        rest = await frames_of(agent, 2, w.CLOSE, timeout=5)
        assert w.EOF in [f.type for f in rest]
        for _ in range(40):
            if any(e.ended for e in proxy.audit.events()):
                break
            await asyncio.sleep(0.05)
        (event,) = proxy.audit.events()
        assert (event.allowed, event.host, event.bytes_up, event.bytes_down) == (
            True,
            "up.test",
            4,
            4,
        )


async def test_connection_quota_over_streams_leaves_the_open_tunnel_alone() -> None:
    async with Upstream() as up, proxy_channel(up.port, max_connections=1) as (agent, _):
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        agent.send(w.data(2, f"CONNECT up.test:{up.port} HTTP/1.1\r\n\r\n".encode()))
        assert sent_data(await frames_of(agent, 2, w.DATA)).startswith(b"HTTP/1.1 200")
        second = await ask(agent, 4, f"CONNECT up.test:{up.port} HTTP/1.1\r\n\r\n".encode())
        assert second.startswith(b"HTTP/1.1 429") and b"QUOTA_CONNECTIONS" in second
        agent.send(w.data(2, b"still"))
        assert sent_data(await frames_of(agent, 2, w.DATA)) == b"still"
        assert up.connections == 1


async def test_byte_quota_over_a_stream_cuts_the_tunnel() -> None:
    async with Upstream() as up, proxy_channel(up.port, max_bytes_up=10) as (agent, proxy):
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        agent.send(w.data(2, f"CONNECT up.test:{up.port} HTTP/1.1\r\n\r\n".encode()))
        assert sent_data(await frames_of(agent, 2, w.DATA)).startswith(b"HTTP/1.1 200")
        agent.send(w.data(2, b"0123456789abcdef"))
        got = await frames_of(agent, 2, w.CLOSE, timeout=5)
        assert len(sent_data(got)) <= 10
        for _ in range(40):
            if any(e.ended for e in proxy.audit.events()):
                break
            await asyncio.sleep(0.05)
        assert [e.ended for e in proxy.audit.events() if e.allowed] == ["byte_quota"]


async def test_a_closed_proxy_closes_new_streams_at_once() -> None:
    async with Upstream() as up, proxy_channel(up.port) as (agent, proxy):
        await proxy.close()
        open_egress(agent, 2)
        await agent.recv_type(w.OPEN_OK)
        assert (await agent.recv_type(w.CLOSE)).stream == 2
        assert up.connections == 0
