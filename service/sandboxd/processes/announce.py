"""What the process manager tells the rest of the server: a command started, a command exited.

The manager is the one producer of both, whichever call ran the command (Exec, Run and
Interact through `track`, StartProcess through its task, an adopted process through its
follower): the session's feed, the audit log of background exits and lease renewal on
activity subscribe (docs/architecture.md). A background process's start is told right when it
runs, before anything of it is read, so its exit is never told first.
"""

from __future__ import annotations

from sandboxd import domain_events as de
from sandboxd import tenancy
from sandboxd.models import ExecExited, ExecSpec, Session
from sandboxd.processes.record import BackgroundProcess, ProcessOrigin


def started(observer: de.Observer, tenant: str, proc: BackgroundProcess) -> None:
    told(observer, tenant, proc.session_id, proc.process_id, proc.spec, proc.origin, None)


def exited(observer: de.Observer, tenant: str, proc: BackgroundProcess) -> None:
    """Once the record has its exit (none: nothing to tell)."""
    if (e := proc.exited) is not None:
        told(observer, tenant, proc.session_id, proc.process_id, proc.spec, proc.origin, e)


def told(
    observer: de.Observer,
    tenant: str,
    session_id: str,
    process_id: str,
    spec: ExecSpec,
    origin: ProcessOrigin,
    exit: ExecExited | None,
) -> None:
    """The start (`exit` None) or the exit of a command, recorded here or not (a session at its
    process limit leaves an Exec untracked: it is told all the same)."""
    how = origin.name.lower()
    background = origin is ProcessOrigin.START_PROCESS
    argv = tuple(spec.argv)
    if exit is None:
        observer.emit(de.CommandStarted(tenant, session_id, process_id, argv, how, background))
        return
    observer.emit(
        de.CommandExited(
            tenant=tenant,
            session_id=session_id,
            process_id=process_id,
            argv=argv,
            cwd=spec.cwd,
            origin=how,
            exit_code=exit.exit_code,
            signal=exit.signal,
            timed_out=exit.timed_out,
            duration_s=exit.duration_s,
            background=background,
        )
    )


def input_sent(
    observer: de.Observer, session_id: str, process_id: str, size: int, closed: bool = False
) -> None:
    """SendProcessInput's bytes, or CloseProcessStdin, reached the process (the caller's)."""
    observer.emit(de.ProcessInputSent(tenancy.current(), session_id, process_id, size, closed))


def signalled(observer: de.Observer, session: Session, process_id: str, signal: str) -> None:
    observer.emit(de.ProcessSignalled(session.tenant, session.session_id, process_id, signal))
