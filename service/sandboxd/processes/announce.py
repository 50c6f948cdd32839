"""What the process manager tells the rest of the server: a command started, a command exited.

The manager is the one producer of both, whichever call ran the command (Exec, Run and
Interact through `track`, StartProcess through its task, an adopted process through its
follower): the session's feed, the audit log of background exits and lease renewal on
activity subscribe (docs/architecture.md). A background process's start is told right when it
runs, before anything of it is read, so its exit is never told first.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandboxd import domain_events as de
from sandboxd import tenancy
from sandboxd.models import ExecExited, ExecOutput, ExecSpec, OutputStream, Session
from sandboxd.processes.record import BackgroundProcess, ProcessOrigin


@dataclass(frozen=True)
class Told:
    """What is told of one command besides its start or exit: who, which, and how it runs."""

    tenant: str
    session_id: str
    process_id: str
    spec: ExecSpec
    origin: ProcessOrigin
    pty: bool = False
    request_id: str = ""


def of(tenant: str, proc: BackgroundProcess, request_id: str = "") -> Told:
    return Told(tenant, proc.session_id, proc.process_id, proc.spec, proc.origin, False, request_id)


def started(observer: de.Observer, told: Told) -> None:
    """The command runs (a record here or not: a session at its process limit leaves an Exec
    untracked, and it is told all the same)."""
    observer.emit(
        de.CommandStarted(
            told.tenant,
            told.session_id,
            told.process_id,
            tuple(told.spec.argv),
            told.origin.name.lower(),
            told.origin is ProcessOrigin.START_PROCESS,
            cwd=told.spec.cwd,
            pty=told.pty,
            request_id=told.request_id,
        )
    )


def ended(
    observer: de.Observer, told: Told, exit: ExecExited, stdout_bytes: int, stderr_bytes: int
) -> None:
    """The command's exit, with the output bytes it wrote (as the server read them)."""
    observer.emit(
        de.CommandExited(
            tenant=told.tenant,
            session_id=told.session_id,
            process_id=told.process_id,
            argv=tuple(told.spec.argv),
            cwd=told.spec.cwd,
            origin=told.origin.name.lower(),
            exit_code=exit.exit_code,
            signal=exit.signal,
            timed_out=exit.timed_out,
            duration_s=exit.duration_s,
            background=told.origin is ProcessOrigin.START_PROCESS,
            truncated=exit.truncated,
            stdout_bytes=stdout_bytes,
            stderr_bytes=stderr_bytes,
            pty=told.pty,
        )
    )


class Passing:
    """An Exec's, Run's or Interact's start and exit, told as its events pass (`track`): the
    exit with the bytes of each stream that passed, before any cut of a reply."""

    def __init__(
        self,
        observer: de.Observer,
        session_id: str,
        spec: ExecSpec,
        origin: ProcessOrigin,
        pty: bool,
    ) -> None:
        self._observer = observer
        self._what = (tenancy.current(), session_id, spec, origin, pty)
        self._told: Told | None = None
        self._wrote = dict.fromkeys(OutputStream, 0)

    @property
    def running(self) -> bool:
        """Started and not yet told to have exited."""
        return self._told is not None

    def started(self, process_id: str) -> None:
        tenant, session_id, spec, origin, pty = self._what
        self._told = Told(tenant, session_id, process_id, spec, origin, pty)
        started(self._observer, self._told)

    def output(self, event: ExecOutput) -> None:
        self._wrote[event.stream] += len(event.data)

    def exited(self, exit: ExecExited) -> None:
        if self._told is not None:
            out, err = self._wrote[OutputStream.STDOUT], self._wrote[OutputStream.STDERR]
            ended(self._observer, self._told, exit, out, err)
            self._told = None


def exited(observer: de.Observer, tenant: str, proc: BackgroundProcess) -> None:
    """A background process's exit, once its record has one (none: nothing to tell)."""
    if (e := proc.exited) is not None:
        out, err = proc.end(OutputStream.STDOUT), proc.end(OutputStream.STDERR)
        ended(observer, of(tenant, proc), e, out, err)


def input_sent(
    observer: de.Observer, session_id: str, process_id: str, size: int, closed: bool = False
) -> None:
    """SendProcessInput's bytes, or CloseProcessStdin, reached the process (the caller's)."""
    observer.emit(de.ProcessInputSent(tenancy.current(), session_id, process_id, size, closed))


def signalled(observer: de.Observer, session: Session, process_id: str, signal: str) -> None:
    observer.emit(de.ProcessSignalled(session.tenant, session.session_id, process_id, signal))
