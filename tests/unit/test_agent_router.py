"""The router of agent channels (one per sandbox): opened once, re-opened after the pipe ended,
none for a sandbox without an agent, exec ids inspectable after the stream closed, and the
rescue of an agent that stops answering (kill the user's processes, wake it, new epoch)."""

from __future__ import annotations

import asyncio

import agent_wire as w
import pytest
from agent_peer import ScriptedAgent
from sandboxd.agent.channel import State
from sandboxd.agent.router import AgentRouter, Attached, ChannelSettings
from sandboxd.engine.protocol import ExecRequest, ExecStatus
from sandboxd.errors import SandboxError
from sandboxd.reasons import Reason


class Port:
    """A scripted engine: each attach gives a fresh scripted agent that answers HELLO."""

    def __init__(self, *, agent: bool = True, answer: bool = True) -> None:
        self.agent = agent
        self.answer = answer
        self.agents: list[ScriptedAgent] = []
        self.rescues: list[tuple[str, str]] = []
        self._servers: list[asyncio.Task[None]] = []

    async def attach(self, sandbox_id: str) -> Attached | None:
        if not self.agent:
            return None
        peer = ScriptedAgent()
        self.agents.append(peer)
        self._servers.append(asyncio.create_task(self._serve(peer)))
        return Attached(peer.transport, "65534:65534", {"PATH": "/bin"})

    async def _serve(self, peer: ScriptedAgent) -> None:
        while True:
            frame = await peer.recv(timeout=60)
            if frame.type == w.HELLO and self.answer:
                peer.send_json(w.HELLO_OK, 0, {"version": 1, "nonce": frame.json()["nonce"]})
            elif frame.type == w.OPEN:
                peer.send_json(w.OPEN_OK, frame.stream, {"pid": 7})
                peer.send(w.data(frame.stream, frame.json()["argv"][0].encode(), 1))
                peer.send_json(w.EXIT, frame.stream, {"exit_code": 0, "signal": None})

    async def rescue(self, sandbox_id: str, user: str) -> str:
        self.rescues.append((sandbox_id, user))
        self.answer = True
        return "killed and woken"

    def stop(self) -> None:
        for task in self._servers:
            task.cancel()


FAST = ChannelSettings(window=4096, keepalive_s=0.2, handshake_s=0.4, resend_s=0.05)


async def _run(router: AgentRouter, sandbox: str, argv0: str) -> bytes:
    channel = await router.serves(sandbox, "65534:65534")
    assert channel is not None
    out = b""
    async with router.exec(sandbox, channel, ExecRequest([argv0], "", env={"X": "1"})) as ex:
        while (chunk := await ex.read()) is not None:
            out += chunk[1]
        assert await ex.wait_exit_code() == 0
        exec_id = ex.exec_id
    assert router.owns(exec_id)
    assert router.inspect(exec_id) == ExecStatus(running=False, exit_code=0, pid=7)
    return out


async def test_one_channel_per_sandbox_reopened_after_its_pipe_ended() -> None:
    port = Port()
    router = AgentRouter(port, FAST)
    try:
        assert await _run(router, "sb-a", "/bin/a") == b"/bin/a"
        assert await _run(router, "sb-a", "/bin/b") == b"/bin/b"
        assert len(port.agents) == 1
        assert await router.serves("sb-a", "0:0") is None  # another user: not the agent's
        port.agents[0].hang_up()
        await asyncio.sleep(0.05)
        assert router.state("sb-a") is State.CLOSED
        assert await _run(router, "sb-a", "/bin/c") == b"/bin/c"
        assert len(port.agents) == 2
        await router.forget("sb-a")
        assert router.state("sb-a") is None
    finally:
        await router.close()
        port.stop()


async def test_a_sandbox_without_an_agent_has_no_channel() -> None:
    port = Port(agent=False)
    router = AgentRouter(port, FAST)
    assert await router.serves("sb-old", "65534:65534") is None
    await router.close()


async def test_an_agent_that_does_not_answer_is_rescued() -> None:
    port = Port(answer=False)
    router = AgentRouter(port, FAST)
    try:
        with pytest.raises(SandboxError) as caught:
            await router.open("sb-r")
        assert caught.value.reason == Reason.AGENT_UNAVAILABLE
        for _ in range(100):
            if router.state("sb-r") is State.READY:
                break
            await asyncio.sleep(0.02)
        assert port.rescues == [("sb-r", "65534:65534")]
        assert router.state("sb-r") is State.READY
        assert await _run(router, "sb-r", "/bin/ok") == b"/bin/ok"
    finally:
        await router.close()
        port.stop()


def test_a_bare_command_name_goes_through_sbx_run() -> None:
    """The agent executes absolute paths only; `docker exec` searched PATH (stats run `df`)."""
    from sandboxd.agent.exec_stream import exec_request

    req = exec_request(["df", "-k"], base_env={}, env=None, workdir=None, stdin=False, tty=False)
    assert req["argv"] == ["/.sandboxd/sbx", "run", "--", "df", "-k"]
    req = exec_request(["/bin/df"], base_env={}, env=None, workdir=None, stdin=False, tty=False)
    assert req["argv"] == ["/bin/df"]


async def test_a_detached_stream_attaches_again_after_a_gap() -> None:
    """The agent's ring overran (RESET GAP): the stream attaches again from where it was and
    reports the lost range before the rest of the output (sandboxd.commands.detached)."""
    from sandboxd.commands import Detach, Plain
    from sandboxd.commands.detached import GAP_FD, AgentProcesses

    peer = ScriptedAgent()

    class GapPort(Port):
        async def attach(self, sandbox_id: str) -> Attached | None:
            return Attached(peer.transport, "65534:65534", {})

    router = AgentRouter(GapPort(), FAST)
    detached = AgentProcesses(router)
    serving = asyncio.create_task(peer.handshake())
    try:
        await asyncio.wait_for(router.open("sb-g"), 2)
        await serving

        async def agent_side() -> None:
            sid, req = await peer.accept_open(pid=9)
            assert req["detach"] == {"id": "bg-1", "buffer": 4096}
            peer.output(sid, b"12345")
            peer.send_json(w.RESET, sid, {"error": "GAP", "message": "ring overran"})
            frame = await peer.recv_type(w.OPEN)
            got = frame.json()
            assert got["kind"] == "attach" and got["offsets"] == {"1": 5, "2": 0}
            peer.send_json(w.OPEN_OK, frame.stream, {"start": {"1": 1000, "2": 0}})
            peer.output(frame.stream, b"tail")
            peer.send_json(w.EXIT, frame.stream, {"exit_code": 0, "signal": None})

        script = asyncio.create_task(agent_side())
        got = []
        async with detached.exec("sb-g", Plain(("/bin/x",)), detach=Detach("bg-1", 4096)) as stream:
            while (item := await asyncio.wait_for(stream.read(), 2)) is not None:
                got.append(item)
            assert await stream.wait_exit_code() == 0
        await script
        assert got == [(1, b"12345"), (1 + GAP_FD, (995).to_bytes(8, "big")), (1, b"tail")]
    finally:
        await router.close()


async def test_a_command_without_stdin_sends_its_eof_in_the_opens_write() -> None:
    """No stdin to come (Run, Exec without stdin): the EOF of fd 0 goes in the same write as
    the OPEN, before any OPEN_OK (one frame through the engine's attach instead of two), and
    the command's own close of stdin later sends nothing more."""
    peer = ScriptedAgent()

    class OnePort(Port):
        async def attach(self, sandbox_id: str) -> Attached | None:
            return Attached(peer.transport, "65534:65534", {})

    router = AgentRouter(OnePort(), FAST)
    serving = asyncio.create_task(peer.handshake())
    try:
        channel = await asyncio.wait_for(router.open("sb-e"), 2)
        await serving
        assert channel is not None
        request = ExecRequest(["/bin/true"], "", stdin=True, stdin_ends=True)
        context = router.exec("sb-e", channel, request)  # held: its end would reset the stream
        opening = asyncio.create_task(context.__aenter__())
        chunk = await asyncio.wait_for(peer.transport.to_agent.get(), 2)
        sent = w.Decoder().feed(chunk)
        assert [(f.type, f.stream) for f in sent] == [(w.OPEN, 1), (w.EOF, 1)]
        assert sent[1].payload == b"\x00"  # fd 0
        peer.send_json(w.OPEN_OK, 1, {"pid": 3})
        handle = await asyncio.wait_for(opening, 2)
        handle.close_stdin()
        peer.exit(1)
        assert await asyncio.wait_for(handle.wait_exit_code(), 2) == 0
        await asyncio.sleep(0)
        assert peer.pending() == []  # no second EOF
        await context.__aexit__(None, None, None)
    finally:
        await router.close()
