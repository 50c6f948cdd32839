"""Interact: a command whose stdin, signals and terminal size are driven while it runs.

The caller's messages arrive as an async iterator of `Control`s, applied by a task of the
interaction in the order they came. A bad message (stdin after close, an unknown signal, a bad
size) ends the interaction with that error, and leaving the interaction kills the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sandboxd.errors import DeadlineExceeded, SandboxError
from sandboxd.exec_spec import PtySize, validate_pty_size, validate_signal
from sandboxd.execution import Command, Executor
from sandboxd.models import ExecEvent, ExecOutput, ExecSpec, Session
from sandboxd.reasons import Reason


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


class _Activity:
    """When the interaction last moved: a message from the caller or output of the command."""

    def __init__(self) -> None:
        self.at = time.monotonic()

    def moved(self) -> None:
        self.at = time.monotonic()


async def interact(
    executor: Executor,
    session: Session,
    spec: ExecSpec,
    pty: PtySize | None,
    controls: AsyncIterator[Control],
    keepalive_s: float,
    idle_s: float,
) -> AsyncIterator[ExecEvent]:
    """Run `spec` (on a terminal when `pty` is set) and yield its events while applying controls.

    `spec.stdin`, if any, is written first; stdin stays open until a CloseStdin. With no
    message and no output for `idle_s` the command is ended (INTERACT_IDLE): a terminal someone
    walked away from does not hold its session's pids and memory until the lease ends.
    """
    if pty is not None:
        pty = validate_pty_size(pty.rows, pty.cols)
    activity = _Activity()
    async with executor.start(session, spec, pty=pty) as command:
        applier = asyncio.create_task(_apply(command, spec.stdin, controls, activity))
        watchdog = asyncio.create_task(_watch_idle(command, activity, idle_s))
        try:
            async for event in command.events(keepalive_s=keepalive_s):
                if isinstance(event, ExecOutput):
                    activity.moved()
                yield event
        finally:
            for task in (applier, watchdog):
                task.cancel()
            for task in (applier, watchdog):
                with contextlib.suppress(asyncio.CancelledError):
                    await task


async def _watch_idle(command: Command, activity: _Activity, idle_s: float) -> None:
    while True:
        left = activity.at + idle_s - time.monotonic()
        if left <= 0:
            command.fail(
                DeadlineExceeded(
                    f"no input and no output for {idle_s:g} s: the interactive command was "
                    "ended (InteractStart.idle_timeout sets how long a quiet terminal stays open)",
                    reason=Reason.INTERACT_IDLE,
                    metadata={"idle_timeout": f"{idle_s:g}s"},
                )
            )
            return
        await asyncio.sleep(left)


async def _apply(
    command: Command, stdin: bytes, controls: AsyncIterator[Control], activity: _Activity
) -> None:
    """The start's `stdin`, then the caller's messages in order; the first bad one fails the
    interaction. Here, beside the output being read: the command's output is read only as the
    events are taken (its stream's window is the buffer), so a command that echoes a large
    first stdin must have its output read while that stdin is still being written."""
    try:
        if stdin:
            await command.write(stdin)
        async for control in controls:
            activity.moved()
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
