"""Interact: a command whose stdin, signals and terminal size are driven while it runs.

The caller's messages arrive as an async iterator of `Control`s, applied by a task of the
interaction in the order they came. A bad message (stdin after close, an unknown signal, a bad
size) ends the interaction with that error, and leaving the interaction kills the command.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sandboxd.errors import SandboxError
from sandboxd.exec_spec import PtySize, validate_pty_size, validate_signal
from sandboxd.execution import Command, Executor
from sandboxd.models import ExecEvent, ExecSpec, Session


@dataclass(frozen=True)
class StdinData:
    data: bytes


@dataclass(frozen=True)
class CloseStdin:
    pass


@dataclass(frozen=True)
class SendSignal:
    name: str


@dataclass(frozen=True)
class Resize:
    rows: int
    cols: int


Control = StdinData | CloseStdin | SendSignal | Resize


async def interact(
    executor: Executor,
    session: Session,
    spec: ExecSpec,
    pty: PtySize | None,
    controls: AsyncIterator[Control],
    keepalive_s: float,
) -> AsyncIterator[ExecEvent]:
    """Run `spec` (on a terminal when `pty` is set) and yield its events while applying controls.

    `spec.stdin`, if any, is written first; stdin stays open until a CloseStdin.
    """
    if pty is not None:
        pty = validate_pty_size(pty.rows, pty.cols)
    async with executor.start(session, spec, pty=pty) as command:
        if spec.stdin:
            await command.write(spec.stdin)
        applier = asyncio.create_task(_apply(command, controls))
        try:
            async for event in command.events(keepalive_s=keepalive_s):
                yield event
        finally:
            applier.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await applier


async def _apply(command: Command, controls: AsyncIterator[Control]) -> None:
    """Apply the caller's messages in order; the first bad one fails the interaction."""
    try:
        async for control in controls:
            match control:
                case StdinData(data=data):
                    await command.write(data)
                case CloseStdin():
                    command.close_stdin()
                case SendSignal(name=name):
                    await command.signal(validate_signal(name))
                case Resize(rows=rows, cols=cols):
                    await command.resize(validate_pty_size(rows, cols))
    except SandboxError as exc:
        command.fail(exc)
