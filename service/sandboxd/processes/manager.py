"""Background processes: started by one call, outliving it, reattached to by byte offset.

A `BackgroundProcess` runs in a task the `ProcessManager` owns (closed on shutdown, and for a
session when it is deleted or its lease ends). Where the sandbox has the agent, its output stays
in the agent's ring (in the sandbox's memory) until the record is forgotten here; the server
keeps a 4 MiB live tail per stream while it runs, for followers that keep up, and readers
further back read the agent's ring (processes/follow.py); else (`agent = false`) it goes into
one bounded ring buffer per stream here, under the session's `process_output_buffer_bytes`.
Either way it is addressed by absolute byte offset and the process is never slowed by readers.

Readers follow a process's record (processes/record.py). The exit record is kept after the
process ends, so a late reader still gets `exited`. Exec, Run and Interact commands are recorded
too (`track`, with a smaller buffer): one process id works for GetProcess, AttachProcess and
SignalProcess whichever call started the process; ListProcesses lists the background ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

from sandboxd import domain_events, validation
from sandboxd.commands import Detach
from sandboxd.errors import AlreadyExists, FailedPrecondition, Internal, NotFound, SandboxError
from sandboxd.exec_spec import validate_signal
from sandboxd.execution import Executor, new_token
from sandboxd.models import ExecEvent, ExecExited, ExecOutput, ExecSpec, ExecStarted, Session
from sandboxd.processes import announce
from sandboxd.processes import budget as room
from sandboxd.processes import stdin as process_stdin
from sandboxd.processes.adoption import (
    AdoptionGate,
    KeptClock,
    adopt_all,
    adopted_record,
    agent_ring,
    detach_id,
    follow,
    kept_processes,
    running_sessions,
)
from sandboxd.processes.follow import follow as follow_agent
from sandboxd.processes.forgets import Forgets, forget
from sandboxd.processes.record import (
    AgentKept,
    AttachEvent,
    BackgroundProcess,
    ProcessOrigin,
    StartOptions,
    foreground,
    until_running,
)
from sandboxd.reasons import Reason

log = logging.getLogger(__name__)

MAX_PROCESSES_PER_SESSION = 64  # running plus retained exit records; oldest exited go first
# Output the server keeps for exited processes, per session (rings held here: Exec, Run and
# Interact tails, and background processes of sandboxes without the agent).
EXITED_OUTPUT_BYTES = 64 * 1024 * 1024
# Default of the setting `process_output_buffer_bytes`: what the rings held here for one
# session's background processes may reserve in all (only sandboxes without the agent).
SESSION_OUTPUT_BUFFER_BYTES = 128 * 1024 * 1024
# What is kept per stream of an Exec, Run or Interact command for AttachProcess and GetProcess:
# their caller gets all of it anyway, so only the tail is kept for a second reader.
FOREGROUND_BUFFER_BYTES = 1024 * 1024


_BACKGROUND = ProcessOrigin.START_PROCESS
ADOPTION_WAIT_S = 30.0  # the longest a call on a session's processes waits for its adoption


class ProcessManager:
    """Owns every background process and the task running it."""

    def __init__(
        self,
        executor: Executor,
        observer: domain_events.Observer = domain_events.SILENT,
        output_budget: int = SESSION_OUTPUT_BUFFER_BYTES,
    ) -> None:
        self._executor = executor
        # Every command's start and exit (processes/announce.py): the one producer of both.
        self._observer = observer
        self._output_budget = output_budget  # per session, rings held here
        self._by_session: dict[str, room.Records] = {}
        self._forgets = Forgets()  # of the agents' copies of records dropped here
        self._adoption = AdoptionGate()

    async def close(self) -> None:
        """Server shutdown: end every background process (their trees are killed), and drop
        the agents' records of exited ones, which no server will read any more."""
        for procs in self._by_session.values():
            for proc in [p for p in procs.values() if p.exited is not None]:
                self._drop(procs, proc)
        tasks = self._forgets.pending()
        for session_id in list(self._by_session):
            await self.end_session(session_id)
        if tasks:
            await asyncio.wait(tasks)

    def held_bytes(self) -> int:
        """Output bytes the server holds in rings and live tails for all sessions (the agent's
        are not)."""
        return sum(
            p.retained_bytes() + p.tail_bytes()
            for ps in self._by_session.values()
            for p in ps.values()
        )

    def _records(self, session_id: str) -> room.Seen:
        """The session's records to look at (the shared empty one where it has none)."""
        return self._by_session.get(session_id, room.NO_RECORDS)

    def _records_for(self, session_id: str) -> room.Records:
        """The session's records to put one in: made on its first record."""
        if (procs := self._by_session.get(session_id)) is None:
            procs = self._by_session[session_id] = room.Records()
        return procs

    def _drop(self, procs: room.Procs, proc: BackgroundProcess) -> None:
        """Forget a record; the agent's copy of its output goes too (a task this owns)."""
        del procs[proc.process_id]
        if proc.agent is None or (detached := self._executor.detached) is None:
            return
        self._forgets.send(proc.session_id, detached, proc.agent)

    async def _agent_keeps(self, session: Session) -> bool:
        detached = self._executor.detached
        return detached is not None and await detached.serves(
            session.container_id, session.spec.user
        )

    async def end_session(self, session_id: str) -> None:
        """The session is being deleted or its lease ended: end and forget its processes."""
        procs = self._by_session.pop(session_id, room.NO_RECORDS)
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
        request_id: str = "",
    ) -> BackgroundProcess:
        """Start `spec` in the background; the same id with the same spec returns that process
        (and tells no second start: a retry starts nothing).

        `hold` (a tenant's exec slot) is entered before the process starts and left when it ends;
        `request_id`, the caller's retry key, is told with its start.
        """
        options = options or StartOptions(spec.max_output_bytes)
        pid = validation.validate_process_id(process_id) if process_id else new_token()
        await self.adopted(session.session_id)  # the same id kept by the agent is that one
        procs = self._records_for(session.session_id)
        proc = procs.get(pid)
        if proc is not None:
            if proc.spec != spec or proc.options != options or proc.origin is not _BACKGROUND:
                raise AlreadyExists(
                    f"process {pid!r} already exists in this session with a different command",
                    reason=Reason.PROCESS_ALREADY_EXISTS,
                    metadata={"process_id": pid},
                )
            await until_running(proc)
            return proc
        self._make_room(procs)
        if not await self._agent_keeps(session):
            for old in room.for_buffers(procs, options.buffer_bytes, self._output_budget):
                self._drop(procs, old)
        await self._forgets.settled(session.session_id)  # the agent's room for the new record
        if pid in procs:  # another start of this id won the race meanwhile
            return await self.start(session, spec, pid, hold, options, request_id)
        # Its id is its token too: the agent keeps it under that id (processes/adoption.py).
        proc = BackgroundProcess(session.session_id, pid, spec, options, token=pid)
        procs[pid] = proc
        told = announce.of(session.tenant, proc, request_id)
        proc.task = asyncio.create_task(
            self._run(session, proc, hold or contextlib.nullcontext(), told), name=f"process {pid}"
        )
        try:
            await until_running(proc)
        except SandboxError:
            if procs.get(pid) is proc:
                del procs[pid]
            raise
        return proc

    def _forget_old_exited(self, procs: room.Records, agent_budget: int = 0) -> None:
        """Old exited records past the server's budget, and past their share of the agent's
        budget (`agent_budget`; 0: not a process the agent keeps)."""
        for old in room.past_exited_budget(procs, EXITED_OUTPUT_BYTES):
            self._drop(procs, old)
        if agent_budget:
            for old in room.past_agent_budget(procs, room.agent_exited_limit(agent_budget)):
                self._drop(procs, old)

    def _make_room(self, procs: room.Procs) -> None:
        if (old := room.for_one_more(procs, MAX_PROCESSES_PER_SESSION)) is not None:
            self._drop(procs, old)

    async def _run(
        self,
        session: Session,
        proc: BackgroundProcess,
        hold: AbstractAsyncContextManager[None],
        told: announce.Told,
    ) -> None:
        started = time.monotonic()
        feeder: asyncio.Task[None] | None = None
        try:
            # Detached where the sandbox has an agent: it outlives a server that dies.
            detach = Detach(
                detach_id(proc.process_id, proc.token),
                agent_ring(proc),
                room.session_agent_budget(session.spec),
                timeout_ms=round(proc.spec.timeout_s * 1000),
            )
            async with (
                hold,
                self._executor.start(
                    session, proc.spec, process_id=proc.process_id, token=proc.token, detach=detach
                ) as command,
            ):
                if command.kept_by_agent:  # its output stays in the agent's ring
                    siblings = self._records(proc.session_id)
                    tail = room.tail_room(siblings, proc, self._output_budget)
                    kept = AgentKept(
                        session.container_id, detach.detach_id, proc.options.buffer_bytes
                    )
                    proc.keep_in_agent(kept, tail)
                proc.running.set_result(None)
                # Still in the StartProcess call (it waits on `running`): its record is the
                # call's, acknowledged before the call answers.
                announce.started(self._observer, told)
                if proc.options.keep_stdin_open:
                    proc.command = command
                    feeder = asyncio.create_task(process_stdin.first(proc, command))
                else:
                    command.feed(proc.spec.stdin)
                async for event in command.events(cap_output=proc.options.cap_output):
                    if isinstance(event, ExecOutput):
                        proc.append_at(event.stream, event.offset, event.data)
                    elif isinstance(event, ExecExited):
                        proc.finish(event, complete=True)
                proc.command = None
            procs = self._by_session.get(proc.session_id)
            if procs is not None:
                self._forget_old_exited(procs, room.session_agent_budget(session.spec))
        except Exception as exc:  # a fault of ours too: its caller and readers still get an end
            if not isinstance(exc, SandboxError):
                log.exception("background process %s failed", proc.process_id)
                exc = Internal(f"the background process failed: {exc}")
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
            announce.exited(self._observer, session.tenant, proc)
            await self._forget_detached(session, proc)

    async def _forget_detached(self, session: Session, proc: BackgroundProcess) -> None:
        """The agent's record of an ended detached process is dropped once its exit is ours
        and this server no longer holds the record (the session ended, or never had it: an
        exited record keeps the agent's output until `_drop`)."""
        detached = self._executor.detached
        if detached is None or proc.exited is None:
            return
        if self._records(proc.session_id).get(proc.process_id) is proc:
            return
        kept = AgentKept(session.container_id, detach_id(proc.process_id, proc.token), 0)
        await forget(detached, proc.agent or kept)

    def expect_adoption(self) -> None:
        """Before the server serves: calls on processes wait for `adopt_running`."""
        self._adoption.close()

    async def adopted(self, session_id: str) -> None:
        """Until the session's kept processes are adopted (at once when none are awaited)."""
        if self._adoption.waiting(session_id):
            await self._adoption.wait(session_id, ADOPTION_WAIT_S)

    async def adopt_running(self, sessions: list[Session]) -> None:
        """At start: adopt what the agents of the running sessions kept (process_adoption)."""
        await adopt_all(running_sessions(sessions), self.adopt, self._adoption)

    async def adopt(self, session: Session) -> int:
        """Take back the background processes the session's agent kept while no server was
        there (processes/adoption.py); how many."""
        detached = self._executor.detached
        if detached is None:
            return 0
        procs = self._records_for(session.session_id)
        adopted = 0
        for process_id, token, record in await kept_processes(detached, session):
            if process_id in procs or len(procs) >= MAX_PROCESSES_PER_SESSION:
                continue
            proc, clock = await adopted_record(
                self._executor, session, (process_id, token), record, FOREGROUND_BUFFER_BYTES
            )
            proc.running.set_result(None)
            procs[process_id] = proc
            proc.task = asyncio.create_task(
                self._follow(session, proc, clock), name=f"process {process_id}"
            )
            adopted += 1
        return adopted

    async def _follow(self, session: Session, proc: BackgroundProcess, clock: KeptClock) -> None:
        """An adopted process: its output from the agent's ring, then live, then its exit."""
        started = clock.started_monotonic(time.monotonic()) or time.monotonic()
        try:
            await follow(self._executor, session, proc, clock)
        except SandboxError as exc:
            log.warning("adopted process %s: %s", proc.process_id, exc)
            proc.finish(ExecExited(-1, "", False, False, time.monotonic() - started))
        except asyncio.CancelledError:
            proc.finish(ExecExited(137, "SIGKILL", False, False, time.monotonic() - started))
            raise
        finally:
            announce.exited(self._observer, session.tenant, proc)
            await self._forget_detached(session, proc)

    def follow(
        self, proc: BackgroundProcess, stdout_offset: int, stderr_offset: int, keepalive_s: float
    ) -> AsyncIterator[AttachEvent]:
        """AttachProcess: from the agent's ring where it holds the output, else from ours."""
        detached = self._executor.detached
        if proc.agent is not None and detached is not None:
            return follow_agent(detached, proc, stdout_offset, stderr_offset, keepalive_s)
        return proc.follow(stdout_offset, stderr_offset, keepalive_s)

    def get(self, session_id: str, process_id: str) -> BackgroundProcess:
        proc = self._records(session_id).get(process_id)
        if proc is None:
            raise NotFound(
                f"no background process {process_id[:80]!r} in session {session_id!r}",
                reason=Reason.PROCESS_NOT_FOUND,
                metadata={"process_id": process_id[:80]},
            )
        return proc

    def list(self, session_id: str) -> list[BackgroundProcess]:
        """The background processes (StartProcess); those of Exec, Run, Interact are not listed."""
        procs = self._records(session_id).values()
        return sorted((p for p in procs if p.origin is _BACKGROUND), key=lambda p: p.started_at)

    async def signal(self, session: Session, process_id: str, name: str) -> None:
        validate_signal(name)
        await self.adopted(session.session_id)
        proc = self.get(session.session_id, process_id)
        if proc.exited is not None:
            raise FailedPrecondition(
                f"process {process_id!r} has already exited",
                reason=Reason.PROCESS_EXITED,
                metadata={"process_id": process_id},
            )
        await self._executor.signal(session, proc.token, name)
        announce.signalled(self._observer, session, process_id, name)

    async def send_input(self, session_id: str, process_id: str, data: bytes) -> None:
        """More stdin for a background process started with keep_stdin_open."""
        await process_stdin.send(lambda: self.get(session_id, process_id), data)
        announce.input_sent(self._observer, session_id, process_id, len(data))

    async def close_stdin(self, session_id: str, process_id: str) -> None:
        await process_stdin.close(lambda: self.get(session_id, process_id))
        announce.input_sent(self._observer, session_id, process_id, 0, closed=True)

    async def track(
        self,
        session_id: str,
        spec: ExecSpec,
        origin: ProcessOrigin,
        events: AsyncIterator[ExecEvent],
        pty: bool = False,
    ) -> AsyncIterator[ExecEvent]:
        """Pass an Exec, Run or Interact command's events through, recording it under the id it
        reports so GetProcess, AttachProcess and SignalProcess find it (its tail of output only).

        Its start and exit are told (announce.Passing) before the event goes on: the call's
        audit record is acknowledged before the caller learns the outcome.
        A session at MAX_PROCESSES_PER_SESSION running processes leaves the command untracked
        rather than refusing it: those calls never had such a limit.
        """
        proc: BackgroundProcess | None = None
        began = time.monotonic()
        telling = announce.Passing(self._observer, session_id, spec, origin, pty)
        try:
            async for event in events:
                if isinstance(event, ExecStarted):
                    proc = self._record(session_id, spec, origin, event.process_id)
                    telling.started(event.process_id)
                elif isinstance(event, ExecOutput):
                    telling.output(event)
                    if proc is not None:
                        proc.append(event.stream, event.data)
                elif isinstance(event, ExecExited):
                    if proc is not None:
                        proc.finish(event, complete=True)
                    telling.exited(event)
                yield event
        finally:
            if telling.running:  # the call ended first: it was killed
                killed = ExecExited(137, "SIGKILL", False, False, time.monotonic() - began)
                if proc is not None:
                    proc.finish(killed)
                telling.exited(killed)
            procs = self._by_session.get(session_id)
            if procs is not None:
                self._forget_old_exited(procs)

    def _record(
        self, session_id: str, spec: ExecSpec, origin: ProcessOrigin, process_id: str
    ) -> BackgroundProcess | None:
        procs = self._records_for(session_id)
        if process_id in procs:
            return None
        if len(procs) >= MAX_PROCESSES_PER_SESSION:
            if (oldest := room.oldest_exited(procs)) is None:
                return None
            self._drop(procs, oldest)
        size = min(spec.max_output_bytes, FOREGROUND_BUFFER_BYTES)
        procs[process_id] = proc = foreground(session_id, process_id, spec, origin, size)
        return proc
