"""Egress decisions into the audit log: the proxy's sink (never blocks a proxied connection)."""

from __future__ import annotations

from sandboxd.audit.events import AuditEvent
from sandboxd.audit.writer import AuditWriter
from sandboxd.egress.audit import EgressEvent, EgressSink
from sandboxd.events.hub import EventHub


def egress_sink(writer: AuditWriter, hub: EventHub | None = None) -> EgressSink:
    """Every decision to the audit log; a refusal also to the session's event feed."""

    def record(tenant: str, e: EgressEvent) -> None:
        if hub is not None and not e.allowed:
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
                "egress",
                time=e.time,
                tenant=tenant,
                session_id=e.session_id,
                method=e.method,
                host=e.host,
                port=e.port,
                verdict="allowed" if e.allowed else "refused",
                rule=e.reason or None,
                address=e.address or None,
            )
        )

    return record
