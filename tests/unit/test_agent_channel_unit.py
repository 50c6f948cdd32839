"""The server's side of the agent channel (service/sandboxd/agent/) against a scripted agent
over an in-memory pipe: handshake and epochs, exec streams, flow control, keepalive, and each
bad input, each a clear error on that channel (or stream) only."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator

import agent_wire as w
import pytest
from agent_peer import ScriptedAgent
from sandboxd.agent.channel import Channel, State
from sandboxd.agent.exec_stream import AgentExec, exec_request
from sandboxd.engine.protocol import ExecStatus
from sandboxd.errors import SandboxError
from sandboxd.reasons import Reason

WINDOW = 4096


def make_channel(agent: ScriptedAgent, **kw: float) -> Channel:
    opts: dict[str, float] = {"keepalive_s": 5.0, "handshake_s": 2.0, "resend_s": 0.05}
    opts.update(kw)
    return Channel(agent.transport, name="test", window=WINDOW, **opts)  # type: ignore[arg-type]


@pytest.fixture
async def pair() -> AsyncIterator[tuple[ScriptedAgent, Channel]]:
    agent = ScriptedAgent()
    channel = make_channel(agent)
    starting = asyncio.create_task(channel.start())
    await agent.handshake()
    await starting
    yield agent, channel
    await channel.close()


async def start_exec(agent: ScriptedAgent, channel: Channel, *argv: str) -> tuple[int, AgentExec]:
    request = exec_request(
        argv, base_env={"A": "1"}, env={"B": "2"}, workdir=None, stdin=True, tty=False
    )
    opening = asyncio.create_task(channel.open("exec", request))
    sid, got = await agent.accept_open()
    assert got["kind"] == "exec" and got["argv"] == list(argv)
    assert got["env"] == {"A": "1", "B": "2"} and got["cwd"] == "/"
    stream = await opening
    return sid, AgentExec(channel, stream, f"agent-t-{sid}", 42)


async def read_all(ex: AgentExec) -> bytes:
    out = bytearray()
    while (chunk := await asyncio.wait_for(ex.read(), 2)) is not None:
        out += chunk[1]
    return bytes(out)


def reason_of(exc: BaseException) -> str:
    assert isinstance(exc, SandboxError), exc
    return exc.reason


# ----- handshake and epochs ------------------------------------------------------------------


async def test_handshake_and_an_exec_round_trip(pair: tuple[ScriptedAgent, Channel]) -> None:
    agent, channel = pair
    assert channel.state is State.READY and channel.hello.instance == "peer"
    sid, ex = await start_exec(agent, channel, "/bin/cat")
    assert sid == 1
    await ex.write(b"hello")
    ex.close_stdin()
    data = await agent.recv_type(w.DATA)
    assert data.stream == sid and data.fd == 0 and data.data == b"hello"
    eof = await agent.recv_type(w.EOF)
    assert eof.payload == b"\x00"
    agent.output(sid, b"out")
    agent.output(sid, b"err", fd=2)
    agent.exit(sid, 3)
    assert await asyncio.wait_for(ex.read(), 2) == (1, b"out")
    assert await asyncio.wait_for(ex.read(), 2) == (2, b"err")
    assert await ex.read() is None
    assert await ex.wait_exit_code() == 3 and ex.inspect().running is False
    # The next stream gets the next odd id.
    sid2, _ = await start_exec(agent, channel, "/bin/true")
    assert sid2 == 3


async def test_noise_and_another_nonce_before_the_answer_are_discarded() -> None:
    agent = ScriptedAgent()
    channel = make_channel(agent)
    starting = asyncio.create_task(channel.start())
    hello = (await agent.recv_type(w.HELLO)).json()
    assert hello["version"] == 1 and hello["window"] == WINDOW and len(hello["nonce"]) >= 16
    assert "budget" not in hello  # none known: the agent keeps its own (docs/agent.md, "Memory")
    # A half frame of an old epoch claiming a long payload, an old HELLO_OK, then ours.
    agent.send(w.encode(w.DATA, 7, b"\x01partial")[:-3] + b"\x00\x00\xff\xff")
    agent.send_json(w.HELLO_OK, 0, {"version": 1, "nonce": "f" * 32})
    agent.send_json(w.HELLO_OK, 0, {"version": 1, "nonce": hello["nonce"], "pid": 1})
    await asyncio.wait_for(starting, 2)
    assert channel.state is State.READY
    await channel.close()


async def test_no_answer_is_agent_unavailable_after_resending() -> None:
    agent = ScriptedAgent()
    channel = make_channel(agent, handshake_s=0.5, resend_s=0.1)
    with pytest.raises(SandboxError) as caught:
        await asyncio.wait_for(channel.start(), 3)
    assert caught.value.reason == Reason.AGENT_UNAVAILABLE
    assert channel.state is State.LOST
    agent.pending()
    assert agent.syncs >= 4  # SYNC + HELLO again every resend period
    with pytest.raises(SandboxError) as again:
        await channel.open("exec", {})
    assert again.value.reason == Reason.AGENT_UNAVAILABLE
    await channel.close()


async def test_a_frame_that_cannot_be_parsed_ends_the_epoch_only(
    pair: tuple[ScriptedAgent, Channel],
) -> None:
    agent, channel = pair
    _, ex = await start_exec(agent, channel, "/bin/sleep", "9")
    old = agent.nonce
    agent.send(w.encode(w.DATA, 1, b"\x01x")[:0] + b"\x00\x02\x00\x00\x12\x00\x00\x00\x01")
    with pytest.raises(SandboxError) as caught:
        await asyncio.wait_for(ex.read(), 2)
    assert caught.value.reason == Reason.AGENT_RESTARTED
    # GOAWAY, then a new epoch with a fresh nonce; after it, the channel works again.
    goaway = await agent.recv_type(w.GOAWAY)
    assert goaway.json()["error"] == "PROTOCOL"
    await agent.handshake()
    assert agent.nonce != old
    await asyncio.wait_for(channel.ready(), 2)
    sid, ex2 = await start_exec(agent, channel, "/bin/true")
    assert sid == 1  # ids begin again in a new epoch
    agent.exit(sid, 0)
    assert await ex2.wait_exit_code() == 0


async def test_a_hello_ok_with_another_nonce_mid_epoch_ends_it(
    pair: tuple[ScriptedAgent, Channel],
) -> None:
    agent, channel = pair
    _, ex = await start_exec(agent, channel, "/bin/sleep", "9")
    agent.send_json(w.HELLO_OK, 0, {"version": 1, "nonce": "another-session"})
    with pytest.raises(SandboxError) as caught:
        await asyncio.wait_for(ex.read(), 2)
    assert caught.value.reason == Reason.AGENT_RESTARTED
    await agent.handshake()
    await asyncio.wait_for(channel.ready(), 2)


async def test_the_pipe_ending_fails_streams_with_agent_restarted(
    pair: tuple[ScriptedAgent, Channel],
) -> None:
    agent, channel = pair
    _, ex = await start_exec(agent, channel, "/bin/sleep", "9")
    agent.hang_up()
    with pytest.raises(SandboxError) as caught:
        await asyncio.wait_for(ex.wait_exit_code(), 2)
    assert caught.value.reason == Reason.AGENT_RESTARTED
    assert channel.state is State.CLOSED


# ----- keepalive -----------------------------------------------------------------------------


async def test_silence_is_a_ping_then_a_lost_channel() -> None:
    agent = ScriptedAgent()
    lost: list[str] = []
    channel = Channel(
        agent.transport,
        name="t",
        window=WINDOW,
        keepalive_s=0.2,
        handshake_s=2,
        resend_s=0.05,
        on_lost=lambda _c, why: lost.append(why),
    )
    starting = asyncio.create_task(channel.start())
    await agent.handshake()
    await starting
    _, ex = await start_exec(agent, channel, "/bin/sleep", "9")
    ping = await agent.recv_type(w.PING, timeout=1)
    assert len(ping.payload) == 8
    with pytest.raises(SandboxError) as caught:
        await asyncio.wait_for(ex.read(), 2)
    assert caught.value.reason == Reason.AGENT_UNAVAILABLE
    assert channel.state is State.LOST and lost and "keepalive" in lost[0]
    await channel.close()


async def test_pongs_and_pings_keep_it_alive() -> None:
    agent = ScriptedAgent()
    channel = make_channel(agent, keepalive_s=0.2)
    starting = asyncio.create_task(channel.start())
    await agent.handshake()
    await starting
    loop = asyncio.get_running_loop()
    end = loop.time() + 1.0
    while loop.time() < end:
        agent.send(w.encode(w.PING, 0, b"12345678"))
        pong = await agent.recv_type(w.PONG)
        assert pong.payload == b"12345678"
        await asyncio.sleep(0.1)
    assert channel.state is State.READY
    await channel.close()


# ----- flow control --------------------------------------------------------------------------


async def test_a_slow_reader_stalls_only_its_stream(pair: tuple[ScriptedAgent, Channel]) -> None:
    agent, channel = pair
    slow_id, slow = await start_exec(agent, channel, "/bin/yes")
    fast_id, fast = await start_exec(agent, channel, "/bin/echo")
    agent.output(slow_id, b"s" * WINDOW)  # the whole window, never read
    agent.output(fast_id, b"f" * 100)
    agent.exit(fast_id)
    assert await asyncio.wait_for(read_all(fast), 2) == b"f" * 100
    # Reading half the slow stream's window gives the agent that much credit back.
    got = await slow.read_joined(WINDOW // 2)
    assert got is not None and len(got[1]) >= WINDOW // 2
    win = await agent.recv_type(w.WINDOW)
    assert win.stream == slow_id and int.from_bytes(win.payload, "big") >= WINDOW // 2


async def test_overrunning_the_window_resets_that_stream(
    pair: tuple[ScriptedAgent, Channel],
) -> None:
    agent, channel = pair
    bad_id, bad = await start_exec(agent, channel, "/bin/yes")
    good_id, good = await start_exec(agent, channel, "/bin/echo")
    agent.output(bad_id, b"x" * WINDOW)
    agent.output(bad_id, b"x")
    reset = await agent.recv_type(w.RESET)
    assert reset.stream == bad_id and reset.json()["error"] == "FLOW_CONTROL"
    with pytest.raises(SandboxError) as caught:
        await asyncio.wait_for(read_all(bad), 2)
    assert caught.value.reason == Reason.AGENT_PROTOCOL_ERROR
    agent.output(good_id, b"ok")
    agent.exit(good_id)
    assert await read_all(good) == b"ok"


async def test_stdin_never_exceeds_the_agents_window(pair: tuple[ScriptedAgent, Channel]) -> None:
    agent, channel = pair
    sid, ex = await start_exec(agent, channel, "/bin/cat")
    writing = asyncio.create_task(ex.write(b"i" * (3 * WINDOW)))
    await asyncio.sleep(0.2)
    sent = sum(len(f.data) for f in agent.pending() if f.type == w.DATA)
    assert sent == WINDOW and not writing.done()
    agent.send(w.window(sid, 2 * WINDOW))
    await asyncio.wait_for(writing, 2)
    sent += sum(len(f.data) for f in agent.pending() if f.type == w.DATA)
    assert sent == 3 * WINDOW


# ----- bad input, each on its stream only --------------------------------------------------


async def test_an_unknown_frame_type_resets_that_stream(
    pair: tuple[ScriptedAgent, Channel],
) -> None:
    agent, channel = pair
    bad_id, bad = await start_exec(agent, channel, "/bin/a")
    good_id, good = await start_exec(agent, channel, "/bin/b")
    agent.send(w.encode(0x7F, bad_id, b"??"))
    reset = await agent.recv_type(w.RESET)
    assert reset.stream == bad_id and reset.json()["error"] == "PROTOCOL"
    with pytest.raises(SandboxError) as caught:
        await asyncio.wait_for(bad.read(), 2)
    assert caught.value.reason == Reason.AGENT_PROTOCOL_ERROR
    agent.output(good_id, b"fine")
    agent.exit(good_id)
    assert await read_all(good) == b"fine" and channel.state is State.READY


async def test_streams_opened_twice_are_reset(pair: tuple[ScriptedAgent, Channel]) -> None:
    agent, channel = pair
    ours, ex = await start_exec(agent, channel, "/bin/a")
    agent.send_json(w.OPEN, ours, {"kind": "exec"})  # our own stream, opened again
    reset = await agent.recv_type(w.RESET)
    assert reset.stream == ours and reset.json()["error"] == "PROTOCOL"
    with pytest.raises(SandboxError):
        await asyncio.wait_for(ex.read(), 2)
    agent.send_json(w.OPEN, 2, {"kind": "egress", "peer": "127.0.0.1:1"})
    assert (await agent.recv_type(w.RESET)).stream == 2  # egress is not served here
    agent.send_json(w.OPEN, 2, {"kind": "egress", "peer": "127.0.0.1:1"})
    again = await agent.recv_type(w.RESET)
    assert again.stream == 2 and again.json()["error"] == "PROTOCOL"
    assert channel.state is State.READY


async def test_data_after_eof_resets_the_stream(pair: tuple[ScriptedAgent, Channel]) -> None:
    agent, channel = pair
    sid, ex = await start_exec(agent, channel, "/bin/a")
    agent.output(sid, b"last")
    agent.send(w.encode(w.EOF, sid, b"\x01"))
    agent.output(sid, b"more")
    reset = await agent.recv_type(w.RESET)
    assert reset.stream == sid and reset.json()["error"] == "PROTOCOL"
    assert await ex.read() == (1, b"last")  # what came before the breach is delivered
    with pytest.raises(SandboxError) as caught:
        await ex.read()
    assert caught.value.reason == Reason.AGENT_PROTOCOL_ERROR


async def test_frames_on_ids_this_server_never_opened(pair: tuple[ScriptedAgent, Channel]) -> None:
    """An agent answering with another session's stream ids: RESET there, nothing else moves."""
    agent, channel = pair
    sid, ex = await start_exec(agent, channel, "/bin/a")
    agent.output(99, b"someone else's")
    agent.exit(77)
    first, second = await agent.recv_type(w.RESET), await agent.recv_type(w.RESET)
    assert {first.stream, second.stream} == {99, 77}
    agent.output(sid, b"mine")
    agent.exit(sid)
    assert await read_all(ex) == b"mine"
    assert channel.state is State.READY


async def test_late_frames_of_a_stream_we_ended_are_ignored(
    pair: tuple[ScriptedAgent, Channel],
) -> None:
    agent, channel = pair
    sid, ex = await start_exec(agent, channel, "/bin/a")
    await ex.close()
    reset = await agent.recv_type(w.RESET)
    assert reset.stream == sid
    agent.output(sid, b"in flight")
    agent.exit(sid)
    await asyncio.sleep(0.05)
    assert not [f for f in agent.pending() if f.type == w.RESET]
    assert ex.inspect() == ExecStatus(running=False, exit_code=-1, pid=42)


async def test_an_exec_the_agent_refuses(pair: tuple[ScriptedAgent, Channel]) -> None:
    agent, channel = pair
    opening = asyncio.create_task(channel.open("exec", {"argv": ["/nope"]}))
    frame = await agent.recv_type(w.OPEN)
    agent.send_json(w.RESET, frame.stream, {"error": "NOT_FOUND", "message": "/nope"})
    with pytest.raises(SandboxError) as caught:
        await opening
    assert caught.value.reason == Reason.NOT_FOUND and "/nope" in str(caught.value)
    assert channel.open_streams == 0


async def test_damage_on_one_channel_leaves_another_alone() -> None:
    a, b = ScriptedAgent(), ScriptedAgent()
    ca, cb = make_channel(a), make_channel(b)
    sa, sb = asyncio.create_task(ca.start()), asyncio.create_task(cb.start())
    await a.handshake()
    await b.handshake()
    await sa
    await sb
    _, ex_b = await start_exec(b, cb, "/bin/b")
    a.send(b"\x7f\xff\xff\xff" + b"garbage" * 10)  # an impossible length: a's epoch ends
    await a.recv_type(w.GOAWAY)
    assert ca.state is State.CONNECTING
    b.output(1, b"b is fine")
    b.exit(1)
    assert await read_all(ex_b) == b"b is fine"
    assert cb.state is State.READY and cb.epoch == 1
    await ca.close()
    await cb.close()


async def test_close_cancels_its_tasks_and_fails_open_streams(
    pair: tuple[ScriptedAgent, Channel],
) -> None:
    agent, channel = pair
    _, ex = await start_exec(agent, channel, "/bin/a")
    before = len(asyncio.all_tasks())
    await channel.close()
    assert len(asyncio.all_tasks()) < before
    with pytest.raises(SandboxError):
        await ex.read()
    assert agent.transport.closed
    assert json.dumps(dataclasses.asdict(ex.inspect()))  # plain data


async def test_hello_carries_the_agents_memory_budget() -> None:
    """The sandbox's share for the agent's buffers (agent/memory.py) goes in every HELLO, so
    an agent knows its budget before any detached exec tells it again."""
    agent = ScriptedAgent()
    channel = Channel(agent.transport, name="test", window=WINDOW, resend_s=0.05, budget=1 << 25)
    starting = asyncio.create_task(channel.start())
    hello = (await agent.recv_type(w.HELLO)).json()
    assert hello["budget"] == 1 << 25
    agent.send_json(w.HELLO_OK, 0, {"version": 1, "nonce": hello["nonce"], "pid": 1})
    await asyncio.wait_for(starting, 2)
    await channel.close()


async def test_a_frame_sent_while_nothing_is_queued_is_written_by_its_sender() -> None:
    """A pipe that takes bytes without a wait gets a lone frame from its sender (no turn of
    the writer task); what comes while the pipe would wait goes through the queue, in order."""
    from sandboxd.agent.transport import FrameWriter

    class Pipe:
        def __init__(self) -> None:
            self.now: list[bytes] = []
            self.later: list[bytes] = []
            self.takes = True

        def write_now(self, data: bytes) -> bool:
            if self.takes:
                self.now.append(data)
            return self.takes

        async def write(self, data: bytes) -> None:
            self.later.append(data)

        async def read(self) -> bytes | None:
            return None

        async def close(self) -> None:
            pass

    pipe = Pipe()
    writer = FrameWriter(pipe)
    await writer.send(b"a")
    writer.send_now(b"b")
    assert pipe.now == [b"a", b"b"] and pipe.later == []
    pipe.takes = False
    await writer.send(b"c")
    pipe.takes = True
    await writer.send(b"d")  # "c" is queued ahead of it: "d" must follow, not pass it
    assert pipe.now == [b"a", b"b"]
    task = asyncio.create_task(writer.run())
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()
    assert pipe.later == [b"cd"]
