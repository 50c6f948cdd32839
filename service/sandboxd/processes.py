"""Background processes: started by one call, outliving it, reattached to by byte offset.

A `BackgroundProcess` runs in a task the `ProcessManager` owns (closed on shutdown, and for a
session when it is deleted or its lease ends). Its output goes into one bounded ring buffer per
stream, addressed by absolute byte offset, so memory per process is capped and the process is
never slowed by readers.

Readers follow a process's record (process_record.py). The exit record is kept after the
process ends, so a late reader still gets `exited`. Exec, Run and Interact commands are recorded
too (`track`, with a smaller buffer): one process id works for GetProcess, AttachProcess and
SignalProcess whichever call started the process; ListProcesses lists the background ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

from sandboxd import validation
from sandboxd.engine.protocol import Detach
from sandboxd.errors import (
    AlreadyExists,
    FailedPrecondition,
    NotFound,
    ResourceExhausted,
    SandboxError,
)
from sandboxd.exec_spec import validate_signal
from sandboxd.execution import Command, Executor, new_token
from sandboxd.models import (
    ExecEvent,
    ExecExited,
    ExecOutput,
    ExecSpec,
    ExecStarted,
    Session,
)
from sandboxd.output_ring import OutputBuffer
from sandboxd.process_adoption import (
    agent_ring,
    detach_id,
    follow,
    kept_processes,
    read_cmdline,
    running_sessions,
    spec_from_cmdline,
)
from sandboxd.process_record import (
    AttachEvent,
    BackgroundProcess,
    OutputGap,
    ProcessOrigin,
    StartOptions,
)
from sandboxd.reasons import Reason

log = logging.getLogger(__name__)

__all__ = [
    "AttachEvent",
    "BackgroundProcess",
    "OutputBuffer",
    "OutputGap",
    "ProcessManager",
    "ProcessOrigin",
    "StartOptions",
]

MAX_PROCESSES_PER_SESSION = 64  # running plus retained exit records; oldest exited go first
EXITED_OUTPUT_BYTES = 64 * 1024 * 1024  # output kept for exited processes, per session
# Output buffers one session's background processes may reserve in all: a running process
# reserves two rings of its max_output_bytes, an exited one what it still keeps. Without it,
# 64 processes x 2 x 16 MiB would let one session hold 2 GiB of server memory.
# TODO(lead): setting
SESSION_OUTPUT_BUFFER_BYTES = 128 * 1024 * 1024
# What is kept per stream of an Exec, Run or Interact command for AttachProcess and GetProcess:
# their caller gets all of it anyway, so only the tail is kept for a second reader.
FOREGROUND_BUFFER_BYTES = 1024 * 1024


_BACKGROUND = ProcessOrigin.START_PROCESS


class ProcessManager:
    """Owns every background process and the task running it."""

    def __init__(
        self,
        executor: Executor,
        on_exit: Callable[[Session, BackgroundProcess], None] | None = None,
    ) -> None:
        self._executor = executor
        self._on_exit = on_exit  # the audit log and the session's event feed
        self._by_session: dict[str, dict[str, BackgroundProcess]] = {}

    async def close(self) -> None:
        """Server shutdown: end every background process (their trees are killed)."""
        for session_id in list(self._by_session):
            await self.end_session(session_id)

    async def end_session(self, session_id: str) -> None:
        """The session is being deleted or its lease ended: end and forget its processes."""
        procs = self._by_session.pop(session_id, {})
        tasks = [p.task for p in procs.values() if p.task is not None and not p.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def start(
        self,
        session: Session,
        spec: ExecSpec,
        process_id: str = "",
        hold: AbstractAsyncContextManager[None] | None = None,
        options: StartOptions | None = None,
    ) -> BackgroundProcess:
        """Start `spec` in the background; the same id with the same spec returns that process.

        `hold` (a tenant's exec slot) is entered before the process starts and left when it ends.
        """
        options = options or StartOptions(spec.max_output_bytes)
        pid = validation.validate_process_id(process_id) if process_id else new_token()
        procs = self._by_session.setdefault(session.session_id, {})
        proc = procs.get(pid)
        if proc is not None:
            if proc.spec != spec or proc.options != options or proc.origin is not _BACKGROUND:
                raise AlreadyExists(
                    f"process {pid!r} already exists in this session with a different command",
                    reason=Reason.PROCESS_ALREADY_EXISTS,
                    metadata={"process_id": pid},
                )
            await self._started(proc)
            return proc
        self._make_room(procs)
        self._reserve_buffers(procs, options.buffer_bytes)
        # Its id is its token too: the agent keeps it under that id (process_adoption.py).
        proc = BackgroundProcess(session.session_id, pid, spec, options, token=pid)
        procs[pid] = proc
        proc.task = asyncio.create_task(
            self._run(session, proc, hold or contextlib.nullcontext()), name=f"process {pid}"
        )
        try:
            await self._started(proc)
        except SandboxError:
            if procs.get(pid) is proc:
                del procs[pid]
            raise
        return proc

    @staticmethod
    async def _started(proc: BackgroundProcess) -> None:
        """Wait until the process runs. Its start ended by the session's end (DeleteSession or
        the lease racing this call cancels it) is an answer, never a call left unanswered."""
        try:
            await asyncio.shield(proc.running)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if proc.running.cancelled() and (task is None or not task.cancelling()):
                raise FailedPrecondition(
                    f"the session {proc.session_id!r} ended while process "
                    f"{proc.process_id!r} was starting",
                    reason=Reason.SESSION_NOT_RUNNING,
                    metadata={"session_id": proc.session_id, "process_id": proc.process_id},
                ) from None
            raise

    @staticmethod
    def _forget_old_exited(procs: dict[str, BackgroundProcess]) -> None:
        """Exit records keep their output for late readers, up to EXITED_OUTPUT_BYTES in all."""
        exited = sorted((p for p in procs.values() if p.exited), key=lambda p: p.started_at)
        total = sum(p.retained_bytes() for p in exited)
        for old in exited:
            if total <= EXITED_OUTPUT_BYTES:
                break
            total -= old.retained_bytes()
            del procs[old.process_id]

    @staticmethod
    def _reserve_buffers(procs: dict[str, BackgroundProcess], buffer_bytes: int) -> None:
        """Room in the session's buffer budget for two rings of `buffer_bytes`: old exit
        records go first; if running processes hold it all, the start is refused."""
        need = 2 * buffer_bytes

        def reserved() -> int:
            return sum(
                p.retained_bytes() if p.exited else 2 * p.options.buffer_bytes
                for p in procs.values()
            )

        exited = sorted((p for p in procs.values() if p.exited), key=lambda p: p.started_at)
        while reserved() + need > SESSION_OUTPUT_BUFFER_BYTES and exited:
            del procs[exited.pop(0).process_id]
        if reserved() + need > SESSION_OUTPUT_BUFFER_BYTES:
            raise ResourceExhausted(
                f"this session's background processes already reserve {reserved()} bytes of "
                f"output buffers; {need} more (two streams of max_output_bytes) would pass the "
                f"budget of {SESSION_OUTPUT_BUFFER_BYTES}: end a process or lower "
                "max_output_bytes",
                reason=Reason.OUTPUT_BUFFER_BUDGET,
                metadata={"limit": str(SESSION_OUTPUT_BUFFER_BYTES)},
            )

    def _make_room(self, procs: dict[str, BackgroundProcess]) -> None:
        if len(procs) < MAX_PROCESSES_PER_SESSION:
            return
        exited = [p for p in procs.values() if p.exited is not None]
        if not exited:
            raise ResourceExhausted(
                f"this session already runs {MAX_PROCESSES_PER_SESSION} background processes",
                reason=Reason.TOO_MANY_PROCESSES,
                metadata={"limit": str(MAX_PROCESSES_PER_SESSION)},
            )
        oldest = min(exited, key=lambda p: p.started_at)
        del procs[oldest.process_id]

    async def _run(
        self, session: Session, proc: BackgroundProcess, hold: AbstractAsyncContextManager[None]
    ) -> None:
        started = time.monotonic()
        feeder: asyncio.Task[None] | None = None
        try:
            # Detached where the sandbox has an agent: it outlives a server that dies.
            detach = Detach(detach_id(proc.process_id, proc.token), agent_ring(proc))
            async with (
                hold,
                self._executor.start(
                    session, proc.spec, process_id=proc.process_id, token=proc.token, detach=detach
                ) as command,
            ):
                proc.running.set_result(None)
                if proc.options.keep_stdin_open:
                    proc.command = command
                    feeder = asyncio.create_task(self._first_stdin(proc, command))
                else:
                    command.feed(proc.spec.stdin)
                async for event in command.events(cap_output=proc.options.cap_output):
                    if isinstance(event, ExecOutput):
                        proc.append_at(event.stream, event.offset, event.data)
                    elif isinstance(event, ExecExited):
                        proc.finish(event)
                proc.command = None
            procs = self._by_session.get(proc.session_id)
            if procs is not None:
                self._forget_old_exited(procs)
        except SandboxError as exc:
            if not proc.running.done():
                proc.running.set_exception(exc)
                return
            log.warning("background process %s: %s", proc.process_id, exc)
            proc.finish(ExecExited(-1, "", False, False, time.monotonic() - started))
        except asyncio.CancelledError:
            if not proc.running.done():
                proc.running.cancel()
            proc.finish(ExecExited(137, "SIGKILL", False, False, time.monotonic() - started))
            raise
        finally:
            proc.command = None
            if feeder is not None:
                feeder.cancel()
            if proc.exited is not None and self._on_exit is not None:
                self._on_exit(session, proc)
            await self._forget_detached(session, proc)

    async def _forget_detached(self, session: Session, proc: BackgroundProcess) -> None:
        """The agent's record of an ended detached process is dropped once its exit is ours."""
        detached = self._executor.detached
        if detached is None or proc.exited is None:
            return
        with contextlib.suppress(SandboxError, ConnectionError, TimeoutError):
            async with asyncio.timeout(5):
                await detached.forget(session.container_id, detach_id(proc.process_id, proc.token))

    async def adopt_running(self, sessions: list[Session]) -> None:
        """At start: adopt what the agents of the running sessions kept, one session at a
        time, each failure its session's only."""
        for session in running_sessions(sessions):
            try:
                if n := await self.adopt(session):
                    log.info("session %s: %d background processes adopted", session.session_id, n)
            except (SandboxError, ConnectionError, TimeoutError) as exc:
                log.warning(
                    "session %s: background processes not adopted: %s", session.session_id, exc
                )

    async def adopt(self, session: Session) -> int:
        """Take back the background processes the session's agent kept while no server was
        there (process_adoption.py); how many."""
        detached = self._executor.detached
        if detached is None:
            return 0
        procs = self._by_session.setdefault(session.session_id, {})
        adopted = 0
        for process_id, token, record in await kept_processes(detached, session):
            if process_id in procs or len(procs) >= MAX_PROCESSES_PER_SESSION:
                continue
            pid = record.get("pid")
            cmdline = b""
            if record.get("running") and isinstance(pid, int):
                cmdline = await read_cmdline(self._executor, session, pid)
            spec = spec_from_cmdline(cmdline, FOREGROUND_BUFFER_BYTES)
            proc = BackgroundProcess(
                session.session_id,
                process_id,
                spec,
                StartOptions(spec.max_output_bytes),
                _BACKGROUND,
                token=token,
            )
            proc.running.set_result(None)
            procs[process_id] = proc
            proc.task = asyncio.create_task(
                self._follow(session, proc), name=f"process {process_id}"
            )
            adopted += 1
        return adopted

    async def _follow(self, session: Session, proc: BackgroundProcess) -> None:
        """An adopted process: its output from the agent's ring, then live, then its exit."""
        started = time.monotonic()
        try:
            await follow(self._executor, session, proc)
        except SandboxError as exc:
            log.warning("adopted process %s: %s", proc.process_id, exc)
            proc.finish(ExecExited(-1, "", False, False, time.monotonic() - started))
        except asyncio.CancelledError:
            proc.finish(ExecExited(137, "SIGKILL", False, False, time.monotonic() - started))
            raise
        finally:
            if proc.exited is not None and self._on_exit is not None:
                self._on_exit(session, proc)
            await self._forget_detached(session, proc)

    @staticmethod
    async def _first_stdin(proc: BackgroundProcess, command: Command) -> None:
        """StartProcess's `stdin`, written before any SendProcessInput (the lock)."""
        async with proc.stdin_lock:
            with contextlib.suppress(SandboxError, ConnectionError):
                await command.write(proc.spec.stdin)

    def get(self, session_id: str, process_id: str) -> BackgroundProcess:
        proc = self._by_session.get(session_id, {}).get(process_id)
        if proc is None:
            raise NotFound(
                f"no background process {process_id[:80]!r} in session {session_id!r}",
                reason=Reason.PROCESS_NOT_FOUND,
                metadata={"process_id": process_id[:80]},
            )
        return proc

    def list(self, session_id: str) -> list[BackgroundProcess]:
        """The background processes (StartProcess); those of Exec, Run, Interact are not listed."""
        procs = self._by_session.get(session_id, {}).values()
        return sorted((p for p in procs if p.origin is _BACKGROUND), key=lambda p: p.started_at)

    async def signal(self, session: Session, process_id: str, name: str) -> None:
        validate_signal(name)
        proc = self.get(session.session_id, process_id)
        if proc.exited is not None:
            raise FailedPrecondition(
                f"process {process_id!r} has already exited",
                reason=Reason.PROCESS_EXITED,
                metadata={"process_id": process_id},
            )
        await self._executor.signal(session, proc.token, name)

    async def send_input(self, session_id: str, process_id: str, data: bytes) -> None:
        """More stdin for a background process started with keep_stdin_open."""
        proc = self._open_stdin(session_id, process_id)
        async with proc.stdin_lock:
            command = self._open_stdin(session_id, process_id).command
            assert command is not None
            await command.write(data)

    async def close_stdin(self, session_id: str, process_id: str) -> None:
        """End of file on the process's stdin; idempotent: a second close, or a close after the
        process ended (its stdin is closed for good), is a no-op, so a retry never fails."""
        proc = self.get(session_id, process_id)
        if proc.exited is not None:
            return
        idle = proc.command is None or proc.command.stdin_closed
        if proc.origin is _BACKGROUND and proc.exited is None and idle:
            return  # already closed, or never kept open
        proc = self._open_stdin(session_id, process_id)
        async with proc.stdin_lock:
            if proc.command is not None and not proc.command.stdin_closed:
                proc.command.close_stdin()

    def _open_stdin(self, session_id: str, process_id: str) -> BackgroundProcess:
        proc = self.get(session_id, process_id)
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

    async def track(
        self,
        session_id: str,
        spec: ExecSpec,
        origin: ProcessOrigin,
        events: AsyncIterator[ExecEvent],
    ) -> AsyncIterator[ExecEvent]:
        """Pass an Exec, Run or Interact command's events through, recording it under the id it
        reports so GetProcess, AttachProcess and SignalProcess find it (its tail of output only).

        A session at MAX_PROCESSES_PER_SESSION running processes leaves the command untracked
        rather than refusing it: those calls never had such a limit.
        """
        proc: BackgroundProcess | None = None
        started = time.monotonic()
        try:
            async for event in events:
                if isinstance(event, ExecStarted):
                    proc = self._record(session_id, spec, origin, event.process_id)
                elif proc is not None and isinstance(event, ExecOutput):
                    proc.append(event.stream, event.data)
                elif proc is not None and isinstance(event, ExecExited):
                    proc.finish(event)
                yield event
        finally:
            if proc is not None and proc.exited is None:  # the call ended first: it was killed
                proc.finish(ExecExited(137, "SIGKILL", False, False, time.monotonic() - started))
            procs = self._by_session.get(session_id)
            if procs is not None:
                self._forget_old_exited(procs)

    def _record(
        self, session_id: str, spec: ExecSpec, origin: ProcessOrigin, process_id: str
    ) -> BackgroundProcess | None:
        procs = self._by_session.setdefault(session_id, {})
        if process_id in procs:
            return None
        if len(procs) >= MAX_PROCESSES_PER_SESSION:
            exited = [p for p in procs.values() if p.exited is not None]
            if not exited:
                return None
            del procs[min(exited, key=lambda p: p.started_at).process_id]
        size = min(spec.max_output_bytes, FOREGROUND_BUFFER_BYTES)
        # Exec, Run and Interact start their command with the process id as its token.
        proc = BackgroundProcess(
            session_id, process_id, spec, StartOptions(size), origin, token=process_id
        )
        proc.running.set_result(None)
        procs[process_id] = proc
        return proc
