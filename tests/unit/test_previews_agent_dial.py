"""Previews over the agent channel's `dial` streams, at the channel's seam: the real preview
listener and relay, the server's real channel, and the real agent (`sbx agent` over pipes, its
static and its ASan/UBSan build) dialling TCP servers of the test on this machine's loopback; a
scripted agent where the real one cannot be made to misbehave (an OPEN never answered).

What is checked: an answer comes through byte for byte; nothing listening is 502 (the agent's
RESET `REFUSED`), a reset mid-answer aborts the client's connection (never a clean end), both
half-closes go through, a silent OPEN is 504, and a client that reads nothing holds back the
sandbox (the channel's window is granted only as the client takes the bytes)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import types
from collections.abc import AsyncIterator
from pathlib import Path

import agent_wire as w
import pytest
from agent_peer import ScriptedAgent
from agent_pipes import Helper, PipeTransport, agent_process
from egress_link import free_port
from fakes import FakeCommands, FakeEngine
from preview_world import Parts, close, preview_parts
from sandboxd.agent.channel import Channel
from sandboxd.models import Session
from sandboxd.previews import setup
from sandboxd.previews.agent_dial import AgentDialer
from sandboxd.previews.dialer import ByteStream, ExecDialer
from sandboxd.sessions import CreateSessionInput

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
WINDOW = 65536


@pytest.fixture
async def real_channel(agent_helper: Helper, tmp_path: Path) -> AsyncIterator[Channel]:
    """A channel on the real agent, static and ASan/UBSan (a sanitizer report fails)."""
    root = tmp_path / "ws"
    root.mkdir()
    async with agent_process(agent_helper, root, ENV) as proc:
        channel = Channel(PipeTransport(proc), name="dial", window=WINDOW)  # type: ignore[arg-type]
        await asyncio.wait_for(channel.start(), 10)
        try:
            yield channel
        finally:
            await channel.close()


class NoExec:
    """The fallback dialer, which a sandbox with an agent channel must never use."""

    def __init__(self) -> None:
        self.used = 0

    def open(
        self, session: Session, port: int
    ) -> contextlib.AbstractAsyncContextManager[ByteStream]:
        self.used += 1
        raise AssertionError("sbx dial over an exec for a sandbox with an agent channel")


World = Parts[AgentDialer]


@contextlib.asynccontextmanager
async def _world(tmp_path: Path, channel: Channel, **settings: object) -> AsyncIterator[World]:
    """Previews whose dialer opens `dial` streams on `channel` (never the exec fallback)."""
    fallback = NoExec()

    async def channels(container_id: str) -> Channel | None:
        return channel

    async with preview_parts(tmp_path, AgentDialer(channels, fallback), **settings) as world:
        await world.sessions.create(CreateSessionInput(session_id="s1"))
        yield world
    assert fallback.used == 0


async def _connect(
    world: World, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str]:
    p = await world.previews.publish("s1", port, None, False)
    listen = int(p.path_url.split(":")[2].split("/")[0])
    reader, writer = await asyncio.open_connection("127.0.0.1", listen)
    return reader, writer, p.token


def _req(port: int, token: str, *extra: str, method: str = "GET", path: str = "") -> bytes:
    lines = [
        f"{method} /preview/s1/{port}/{path} HTTP/1.1",
        "Host: x",
        f"X-Sandboxd-Token: {token}",
        *extra,
        "",
        "",
    ]
    return "\r\n".join(lines).encode()


async def test_an_answer_comes_through_the_agents_dial_and_the_stream_is_closed(
    tmp_path: Path, real_channel: Channel
) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB: many windows

    async def serve(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            assert b"X-Sandboxd-Token" not in head
            wr.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await wr.drain()

    async with _world(tmp_path, real_channel) as world:
        port = await world.serve(serve)
        reader, writer, token = await _connect(world, port)
        for _ in range(2):  # keep-alive: one dial stream for both
            writer.write(_req(port, token))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200 OK")
            assert await asyncio.wait_for(reader.readexactly(len(body)), 10) == body
        assert real_channel.open_streams == 1
        await close(writer)
        for _ in range(100):  # the listener ends the stream once the client is gone
            if real_channel.open_streams == 0:
                break
            await asyncio.sleep(0.02)
        assert real_channel.open_streams == 0
        assert world.audit[-1].attributes["status"] == "200"


async def test_nothing_listening_is_502_from_the_agents_refusal(
    tmp_path: Path, real_channel: Channel
) -> None:
    async with _world(tmp_path, real_channel) as world:
        port = free_port()
        reader, writer, token = await _connect(world, port)
        writer.write(_req(port, token))
        got = await asyncio.wait_for(reader.read(), 10)
        await close(writer)
        assert got.startswith(b"HTTP/1.1 502 "), got
        assert b"X-Sandboxd-Refusal: sandbox_closed" in got
        assert f"nothing listens on port {port}".encode() in got
        assert world.audit[-1].attributes["status"] == "502"
        assert real_channel.open_streams == 0


async def test_a_reset_mid_answer_aborts_the_clients_connection(
    tmp_path: Path, real_channel: Channel
) -> None:
    """An answer that ends when the sandbox closes (no length): a reset of the sandbox's
    connection half way must not reach the client as that end (a truncated answer taken for
    whole), but as a reset."""
    sent = asyncio.Event()
    go_on = asyncio.Event()

    async def serve(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        wr.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\npart one ")
        await wr.drain()
        sent.set()
        await go_on.wait()
        sock = wr.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        wr.transport.abort()  # RST: the agent reads ECONNRESET, RESET IO on the stream

    async with _world(tmp_path, real_channel) as world:
        port = await world.serve(serve)
        reader, writer, token = await _connect(world, port)
        writer.write(_req(port, token))
        await asyncio.wait_for(reader.readuntil(b"part one "), 10)
        go_on.set()
        with pytest.raises(ConnectionResetError):
            rest = await asyncio.wait_for(reader.read(), 10)
            raise AssertionError(f"the client saw a clean end after {rest!r}")
        await close(writer)


async def test_half_closes_both_ways_through_an_upgraded_connection(
    tmp_path: Path, real_channel: Channel
) -> None:
    """After a 101 the client's half-close reaches the sandbox as its EOF, while the sandbox
    still answers; then the sandbox's close ends the client's reading."""
    got_eof = asyncio.Event()

    async def serve(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        wr.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n")
        await wr.drain()
        received = await r.read()  # up to the client's half-close
        while more := await r.read():
            received += more
        got_eof.set()
        wr.write(b"after your EOF: " + received)
        await wr.drain()
        wr.write_eof()

    async with _world(tmp_path, real_channel) as world:
        port = await world.serve(serve)
        reader, writer, token = await _connect(world, port)
        writer.write(_req(port, token, "Connection: Upgrade", "Upgrade: x"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 101 ")
        writer.write(b"tunnelled bytes")
        await writer.drain()
        writer.write_eof()
        await asyncio.wait_for(got_eof.wait(), 10)
        assert await asyncio.wait_for(reader.read(), 10) == b"after your EOF: tunnelled bytes"
        await close(writer)
        assert world.audit[-1].attributes["status"] == "101"


async def test_a_client_that_reads_nothing_holds_the_sandbox_back(
    tmp_path: Path, real_channel: Channel
) -> None:
    written = 0

    async def serve(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
        nonlocal written
        await r.readuntil(b"\r\n\r\n")
        wr.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (512 << 20))
        block = b"x" * 65536
        while True:
            wr.write(block)
            await wr.drain()
            written += len(block)

    async with _world(tmp_path, real_channel) as world:
        port = await world.serve(serve)
        p = await world.previews.publish("s1", port, None, False)
        listen = int(p.path_url.split(":")[2].split("/")[0])
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            s.setblocking(False)
            await asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", listen))
            await asyncio.get_running_loop().sock_sendall(s, _req(port, p.token))
            await asyncio.sleep(1.5)
            stalled = written
            await asyncio.sleep(0.5)
            # Loopback socket buffers on both sides, the channel's window and the relay's
            # client buffer: some MiB at most, never the 512 MiB answer.
            assert stalled == written, "the sandbox kept writing to a client reading nothing"
            assert written < 48 << 20, written
            got = 0
            while got < 4 << 20:  # it flows again once the client reads
                chunk = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(s, 65536), 10)
                assert chunk
                got += len(chunk)


async def test_an_open_the_agent_never_answers_is_504_and_reset(tmp_path: Path) -> None:
    agent = ScriptedAgent()
    channel = Channel(agent.transport, name="t", window=WINDOW, resend_s=0.05)  # type: ignore[arg-type]
    starting = asyncio.create_task(channel.start())
    await agent.handshake()
    await starting
    try:
        async with _world(tmp_path, channel, preview_timeout=0.3) as world:
            reader, writer, token = await _connect(world, 8080)
            writer.write(_req(8080, token))
            opened = await agent.recv_type(w.OPEN)
            assert opened.json() == {"kind": "dial", "port": 8080}
            got = await asyncio.wait_for(reader.read(), 10)
            assert got.startswith(b"HTTP/1.1 504 ") and b"sandbox_timeout" in got
            reset = await agent.recv_type(w.RESET)
            assert reset.stream == opened.stream
            await close(writer)
            assert channel.open_streams == 0
    finally:
        await channel.close()


async def test_a_sandbox_without_an_agent_channel_keeps_sbx_dial(tmp_path: Path) -> None:
    engine = FakeEngine()
    without_router = setup.dialer_for(None, FakeCommands(engine))
    assert isinstance(without_router, ExecDialer)  # no agent router: the exec path
    used: list[int] = []

    class Fallback:
        @contextlib.asynccontextmanager
        async def open(self, session: Session, port: int) -> AsyncIterator[ByteStream]:
            used.append(port)
            yield None  # type: ignore[misc]

    async def no_channel(container_id: str) -> Channel | None:
        return None

    dialer = AgentDialer(no_channel, Fallback())
    session = types.SimpleNamespace(session_id="s1", container_id="c1")
    async with dialer.open(session, 8080):  # type: ignore[arg-type]
        pass
    assert used == [8080]
