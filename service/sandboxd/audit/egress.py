"""Audit events from outside the call path: the egress proxy's decisions (never blocking a
proxied connection) and the state changes the server makes on its own."""

from __future__ import annotations

import time
from collections.abc import Callable

from sandboxd.audit.context import CURRENT_CALL
from sandboxd.audit.events import AuditEvent
from sandboxd.audit.writer import AuditWriter
from sandboxd.egress.audit import EgressEvent, EgressSink
from sandboxd.events.hub import EventHub
from sandboxd.models import Session
from sandboxd.processes import BackgroundProcess


def server_lifecycle(writer: AuditWriter) -> Callable[[Session], None]:
    """State changes the server made on its own, outside any call (the reaper's expiry or
    suspension, a container found lost): a caller's own changes are audited with its call."""

    def record(s: Session) -> None:
        if CURRENT_CALL.get():
            return
        writer.record_nowait(
            AuditEvent.of(
                "lifecycle",
                time=time.time(),
                tenant=s.tenant,
                session_id=s.session_id,
                action="server",
                state=s.state.value,
            )
        )

    return record


def background_start(hub: EventHub | None) -> Callable[[Session, BackgroundProcess], None]:
    """A background process runs: PROCESS_STARTED on the session's feed (its StartProcess
    call's audit record is the interceptor's)."""

    def record(s: Session, proc: BackgroundProcess) -> None:
        if hub is not None:
            hub.publish(
                s.tenant,
                s.session_id,
                "PROCESS_STARTED",
                process_id=proc.process_id,
                argv=list(proc.spec.argv),
            )

    return record


def background_exit(
    writer: AuditWriter, hub: EventHub | None
) -> Callable[[Session, BackgroundProcess], None]:
    """A background process ended (its StartProcess call has its own event, committed when it
    answered, which may be after this one): its command event with the exit, and
    PROCESS_EXITED on the session's feed."""

    def record(s: Session, proc: BackgroundProcess) -> None:
        exited = proc.exited
        if exited is None:
            return
        writer.record_nowait(
            AuditEvent.of(
                "command",
                time=time.time(),
                tenant=s.tenant,
                session_id=s.session_id,
                argv=list(proc.spec.argv),
                cwd=proc.spec.cwd,
                background=True,
                process_id=proc.process_id,
                exit_code=exited.exit_code,
                signal=exited.signal or None,
                timed_out=exited.timed_out,
                duration_s=f"{exited.duration_s:.3f}",
            )
        )
        if hub is not None:
            hub.publish(
                s.tenant,
                s.session_id,
                "PROCESS_EXITED",
                process_id=proc.process_id,
                exit_code=exited.exit_code,
                signal=exited.signal or None,
                timed_out=exited.timed_out,
            )

    return record


def egress_sink(writer: AuditWriter, hub: EventHub | None = None) -> EgressSink:
    """Every decision (and secret injection) to the audit log; a refusal also to the
    session's event feed."""

    def record(tenant: str, e: EgressEvent) -> None:
        if hub is not None and not e.allowed and e.kind == "egress":
            hub.publish(
                tenant,
                e.session_id,
                "EGRESS_REFUSED",
                message=f"{e.host or '-'}:{e.port} {e.reason}",
                host=e.host,
                port=e.port,
                rule=e.reason,
            )
        writer.record_nowait(
            AuditEvent.of(
                e.kind,  # egress, or secret_injected / secret_misdirected (by name, no value)
                time=e.time,
                tenant=tenant,
                session_id=e.session_id,
                method=e.method,
                host=e.host,
                port=e.port,
                verdict="allowed" if e.allowed else "refused",
                rule=e.reason or None,
                address=e.address or None,
                secret=e.secret or None,
            )
        )

    return record
