"""The server's channel (service/sandboxd/agent/) against the real agent (`sbx agent`, built
from helper/*.c, static and ASan/UBSan: a sanitizer report fails the test), over pipes and over
the socket channel (`--channel-socket`, engine/agent_socket.py's SocketTransport): the two
implementations of docs/agent.md checked against each other without Docker (the agent over
pipes: tests/agent_pipes.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from agent_pipes import CHANNEL_ENV, Helper, PipeTransport, agent_process
from sandboxd.agent.channel import Channel, State
from sandboxd.agent.exec_stream import AgentExec, exec_request
from sandboxd.engine.agent_socket import SOCKET_NAME, connect
from sandboxd.errors import SandboxError

ENV = CHANNEL_ENV
Open = Callable[[], Awaitable[Channel]]


@contextlib.asynccontextmanager
async def socket_agent(
    helper: Helper, tmp_path: Path, prefix: tuple[str, ...] = ()
) -> AsyncIterator[tuple[asyncio.subprocess.Process, Path]]:
    """The agent listening on a socket in a directory like a mounted socket volume (root's,
    0700), its stdin and stdout pipes open beside it."""
    root = tmp_path / "ws"
    root.mkdir(exist_ok=True)
    # A short path: the agent binds the path it is given, which must fit sun_path (in a
    # sandbox it is AGENT_SOCKET_DIR's; the server connects through /proc/self/fd either way).
    directory = Path(tempfile.mkdtemp(prefix="sbx-sock-"))
    try:
        os.chmod(directory, 0o700)
        args = ("--channel-socket", str(directory / SOCKET_NAME))
        async with agent_process(helper, root, ENV, args, prefix) as proc:
            yield proc, directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(params=["pipe", "socket"])
async def channels(
    request: pytest.FixtureRequest, agent_helper: Helper, tmp_path: Path
) -> AsyncIterator[tuple[asyncio.subprocess.Process, Open]]:
    """The agent, and a way to open a new channel to it: over its pipes, or each one a new
    connection to its socket (what a server restart does)."""
    if request.param == "pipe":
        root = tmp_path / "ws"
        root.mkdir()
        async with agent_process(agent_helper, root, ENV) as proc:
            yield proc, lambda: _channel(PipeTransport(proc))
    else:
        async with socket_agent(agent_helper, tmp_path) as (proc, directory):

            async def over_socket() -> Channel:
                return await _channel(await connect(directory, "real"))

            yield proc, over_socket


async def _channel(transport: object, **kw: float) -> Channel:
    channel = Channel(transport, name="real", window=65536, **kw)  # type: ignore[arg-type]
    await asyncio.wait_for(channel.start(), 10)
    return channel


async def _exec(channel: Channel, *argv: str, stdin: bool = False) -> AgentExec:
    req = exec_request(argv, base_env=ENV, env={"X": "42"}, workdir=None, stdin=stdin, tty=False)
    stream = await channel.open("exec", req)
    return AgentExec(channel, stream, f"agent-real-{stream.id}", stream.opened.result()["pid"])


async def _drain(ex: AgentExec) -> tuple[bytes, bytes]:
    out, err = bytearray(), bytearray()
    while (chunk := await asyncio.wait_for(ex.read(), 10)) is not None:
        (out if chunk[0] == 1 else err).extend(chunk[1])
    return bytes(out), bytes(err)


async def test_commands_over_the_real_agent(
    channels: tuple[asyncio.subprocess.Process, Open],
) -> None:
    proc, open_channel = channels
    channel = await open_channel()
    assert channel.hello.pid == proc.pid and channel.state is State.READY
    ex = await _exec(channel, "/bin/sh", "-c", 'echo "out $X"; echo err >&2; exit 3')
    assert await _drain(ex) == (b"out 42\n", b"err\n")
    assert await ex.wait_exit_code() == 3
    # stdin, half-closed; output far past the window (flow control both ways).
    cat = await _exec(channel, "/bin/cat", stdin=True)
    payload = os.urandom(1 << 20)

    async def feed() -> None:
        await cat.write(payload)
        cat.close_stdin()

    feeder = asyncio.create_task(feed())
    out, _ = await _drain(cat)
    await feeder
    assert out == payload
    assert await cat.wait_exit_code() == 0
    # A bare name is run through `sbx run` (PATH search), which the real agent cannot do: the
    # agent refuses a relative argv[0] itself.
    with pytest.raises(SandboxError):
        await channel.open("exec", {"argv": ["sh"], "env": ENV, "cwd": "/", "stdin": False})
    await channel.close()


async def test_a_killed_command_reports_its_signal(
    channels: tuple[asyncio.subprocess.Process, Open],
) -> None:
    channel = await channels[1]()
    ex = await _exec(channel, "/bin/sh", "-c", "kill -TERM $$")
    await _drain(ex)
    assert await ex.wait_exit_code() == 128 + 15
    await channel.close()


async def test_a_new_epoch_ends_the_old_ones_commands(
    channels: tuple[asyncio.subprocess.Process, Open],
) -> None:
    """A server that restarts begins a new epoch on the same pipe (or a new connection to the
    socket): the old epoch's command is ended by the agent, the new epoch works."""
    open_channel = channels[1]
    first = await open_channel()
    ex = await _exec(first, "/bin/sleep", "30")
    pid = ex.pid
    await first.close()
    second = await open_channel()
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists() or "Z" in _state(pid):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"the old epoch's command {pid} still runs")
    again = await _exec(second, "/bin/echo", "fine")
    assert await _drain(again) == (b"fine\n", b"")
    await second.close()


def _state(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "gone"
    return next((line for line in status.splitlines() if line.startswith("State:")), "")
