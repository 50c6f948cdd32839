"""Background processes that outlived the server (issue 13): on start, each running session's
agent lists the detached processes it kept, and each becomes a `BackgroundProcess` again,
followed from the oldest byte the agent still holds (AttachProcess from 0 replays it), with its
exit recorded when it comes.

What the server knew of a process (its argv, cwd, timeout) is read back from the command line
of its `sbx run` supervisor while it runs; a process that ended meanwhile keeps its output and
exit, with an empty argv.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

from sandboxd.engine.protocol import DetachedExecs, ExecRequest
from sandboxd.errors import SandboxError
from sandboxd.execution import Command, Executor
from sandboxd.models import ExecExited, ExecOutput, ExecSpec, Session, SessionState
from sandboxd.process_record import BackgroundProcess
from sandboxd.validation.identity import SESSION_ID_RE

log = logging.getLogger(__name__)

UNKNOWN_TIMEOUT_S = 7 * 24 * 3600.0  # the supervisor enforces the real one itself
CMDLINE_BYTES = 256 * 1024


AGENT_RING_MAX = 64 * 1024 * 1024  # the agent's bound of a detached ring


AGENT_RING_SLACK = 1024 * 1024


def agent_ring(proc: BackgroundProcess) -> int:
    """The agent's ring per stream (in the sandbox's memory, touched only as it fills): at
    least the server's ring plus slack, so that the live stream loses nothing a server that
    keeps up would have kept; for a capped process all it may write plus slack (it writes on
    until the server's kill lands)."""
    size = proc.options.buffer_bytes
    if proc.options.cap_output:
        size = max(size, proc.spec.max_output_bytes)
    return max(1, min(size + AGENT_RING_SLACK, AGENT_RING_MAX))


def agent_ring_held(record: dict[str, Any]) -> int:
    """How much of each stream an adopted process offers to AttachProcess: what its agent's
    ring holds once full (`end - start` of the listing), else all of it up to AGENT_RING_MAX
    (its ring size is not in the record; readers get the agent's `start` either way)."""
    start, end = record.get("start"), record.get("end")
    held = [
        e - s
        for fd in ("1", "2")
        if isinstance(start, dict)
        and isinstance(end, dict)
        and isinstance(s := start.get(fd), int)
        and isinstance(e := end.get(fd), int)
        and s > 0
        and e > s
    ]
    return max(held, default=AGENT_RING_MAX)


def detach_id(process_id: str, token: str) -> str:
    """The agent's id of a background process: its process id, which is its `sbx run` token
    too (both fit the agent's rule for ids: 1..64 of A-Z a-z 0-9 . _ : -)."""
    return process_id


def parse_detach_id(value: str) -> tuple[str, str] | None:
    """(process id, token) of an agent's record; None for one that is not a process id."""
    return (value, value) if SESSION_ID_RE.match(value) else None


def spec_from_cmdline(cmdline: bytes, buffer_bytes: int) -> ExecSpec:
    """`sbx run --id T --timeout-ms N --cwd D [--tty RxC] -- ARGV...` back into a spec."""
    args = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    timeout_s, cwd, argv = UNKNOWN_TIMEOUT_S, "/workspace", []
    if "--" in args:
        head, argv = args[: args.index("--")], args[args.index("--") + 1 :]
        opts = dict(zip(head[2::2], head[3::2], strict=False))
        with contextlib.suppress(ValueError):
            timeout_s = int(opts.get("--timeout-ms", "")) / 1000
        cwd = opts.get("--cwd", cwd)
    return ExecSpec(argv, cwd, {}, b"", timeout_s, buffer_bytes)


async def read_cmdline(executor: Executor, session: Session, pid: int) -> bytes:
    out = bytearray()
    with contextlib.suppress(SandboxError, TimeoutError):
        async with asyncio.timeout(5):
            async with executor.engine.exec(
                session.container_id,
                ExecRequest(["/bin/cat", f"/proc/{pid}/cmdline"], session.spec.user),
            ) as stream:
                while (chunk := await stream.read()) is not None:
                    if chunk[0] == 1 and len(out) < CMDLINE_BYTES:
                        out += chunk[1]
    return bytes(out)


async def kept_processes(
    detached: DetachedExecs, session: Session
) -> list[tuple[str, str, dict[str, Any]]]:
    """(process id, token, record) of each detached process the session's agent kept."""
    if not await detached.serves(session.container_id, session.spec.user):
        return []
    found = []
    for record in await detached.listing(session.container_id):
        ids = parse_detach_id(str(record.get("id", "")))
        if ids is not None:
            found.append((*ids, record))
    return found


def running_sessions(sessions: Iterable[Session]) -> list[Session]:
    return [s for s in sessions if s.state is SessionState.RUNNING and s.container_id]


async def follow(executor: Executor, session: Session, proc: BackgroundProcess) -> None:
    """An adopted process's output from the agent's ring into its record, then live, then
    its exit. Leaving early (the session ends, the server shuts down) kills it, as for any
    background process."""
    assert executor.detached is not None
    async with executor.detached.attach(
        session.container_id, detach_id(proc.process_id, proc.token)
    ) as stream:
        command = Command(
            executor, session, proc.spec, proc.process_id, proc.token, stream, tty=False
        )
        try:
            async for event in command.events(cap_output=False):
                if isinstance(event, ExecOutput):
                    proc.append_at(event.stream, event.offset, event.data)
                elif isinstance(event, ExecExited):
                    proc.finish(event, complete=True)
        finally:
            if not command.finished:
                executor.kill(session, proc.token, stream.exec_id)
            await command._stop()
