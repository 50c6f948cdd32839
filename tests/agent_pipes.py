"""The real agent (`sbx agent`) as a child process over pipes, for the server's `Channel`.

What the unit tests that check the server's side of docs/agent.md against the C agent without
Docker share (tests/unit/test_agent_channel_real.py, tests/egress_link.py): outside a PID
namespace the agent is a child subreaper, which is all they need.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path


class PipeTransport:
    """The channel's Transport over the agent's stdin and stdout. `close_stdin`: closing the
    channel closes the agent's stdin too (the agent then ends); without, the pipe stays open
    for another epoch (a restarted server's channel on the same agent)."""

    def __init__(self, proc: asyncio.subprocess.Process, *, close_stdin: bool = False) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self._in = proc.stdin
        self._out = proc.stdout
        self._close_stdin = close_stdin

    async def read(self) -> bytes | None:
        chunk = await self._out.read(1 << 16)
        return chunk or None

    async def write(self, data: bytes) -> None:
        self._in.write(data)
        await self._in.drain()

    async def close(self) -> None:
        if self._close_stdin:
            with contextlib.suppress(Exception):
                self._in.close()


@contextlib.asynccontextmanager
async def agent_process(
    binary: Path, root: Path, env: Mapping[str, str]
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`binary --root root agent` with exactly `env`; killed and reaped on exit."""
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        "--root",
        str(root),
        "agent",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=dict(env),
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
