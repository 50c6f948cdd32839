"""The stdin of a background process started with keep_stdin_open (SendProcessInput,
CloseProcessStdin): StartProcess's own `stdin` goes first, each later write under the record's
lock, and a closed or ended stdin is a clear error (or, for a close, a no-op)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from sandboxd.errors import FailedPrecondition, SandboxError
from sandboxd.execution import Command
from sandboxd.processes.record import BackgroundProcess, ProcessOrigin
from sandboxd.reasons import Reason

Lookup = Callable[[], BackgroundProcess]  # the record by its id now (NotFound once forgotten)


async def first(proc: BackgroundProcess, command: Command) -> None:
    """StartProcess's `stdin`, written before any SendProcessInput (the lock)."""
    async with proc.stdin_lock:
        with contextlib.suppress(SandboxError, ConnectionError):
            await command.write(proc.spec.stdin)


def _open(lookup: Lookup) -> BackgroundProcess:
    proc = lookup()
    process_id = proc.process_id
    if proc.exited is not None:
        raise FailedPrecondition(
            f"process {process_id!r} has already exited",
            reason=Reason.PROCESS_EXITED,
            metadata={"process_id": process_id},
        )
    if proc.command is None or proc.command.stdin_closed:
        raise FailedPrecondition(
            f"the stdin of process {process_id!r} is closed: only a StartProcess with "
            "keep_stdin_open takes more input, until CloseProcessStdin",
            reason=Reason.STDIN_CLOSED,
            metadata={"process_id": process_id},
        )
    return proc


async def send(lookup: Lookup, data: bytes) -> None:
    proc = _open(lookup)
    async with proc.stdin_lock:
        command = _open(lookup).command
        assert command is not None
        await command.write(data)


async def close(lookup: Lookup) -> None:
    """End of file on the process's stdin; idempotent: a second close, or a close after the
    process ended (its stdin is closed for good), is a no-op, so a retry never fails."""
    proc = lookup()
    if proc.exited is not None:
        return
    idle = proc.command is None or proc.command.stdin_closed
    if proc.origin is ProcessOrigin.START_PROCESS and idle:
        return  # already closed, or never kept open
    proc = _open(lookup)
    async with proc.stdin_lock:
        if proc.command is not None and not proc.command.stdin_closed:
            proc.command.close_stdin()
