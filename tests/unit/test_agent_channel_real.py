"""The server's channel (service/sandboxd/agent/) against the real agent (`sbx agent`, built
from helper/*.c, static and ASan/UBSan: a sanitizer report fails the test) over pipes: the two
implementations of docs/agent.md checked against each other without Docker (the agent over
pipes: tests/agent_pipes.py)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from agent_pipes import CHANNEL_ENV, PipeTransport
from sandboxd.agent.channel import Channel, State
from sandboxd.agent.exec_stream import AgentExec, exec_request
from sandboxd.errors import SandboxError

ENV = CHANNEL_ENV


async def _channel(proc: asyncio.subprocess.Process, **kw: float) -> Channel:
    channel = Channel(PipeTransport(proc), name="real", window=65536, **kw)  # type: ignore[arg-type]
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


async def test_commands_over_the_real_agent(piped_agent: asyncio.subprocess.Process) -> None:
    channel = await _channel(piped_agent)
    assert channel.hello.pid == piped_agent.pid and channel.state is State.READY
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


async def test_a_killed_command_reports_its_signal(piped_agent: asyncio.subprocess.Process) -> None:
    channel = await _channel(piped_agent)
    ex = await _exec(channel, "/bin/sh", "-c", "kill -TERM $$")
    await _drain(ex)
    assert await ex.wait_exit_code() == 128 + 15
    await channel.close()


async def test_a_new_epoch_ends_the_old_ones_commands(
    piped_agent: asyncio.subprocess.Process,
) -> None:
    """A server that restarts begins a new epoch on the same pipe: the old epoch's command is
    ended by the agent, the new epoch works."""
    first = await _channel(piped_agent)
    ex = await _exec(first, "/bin/sleep", "30")
    pid = ex.pid
    await first.close()
    second = await _channel(piped_agent)
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
