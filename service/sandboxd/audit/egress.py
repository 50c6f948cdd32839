"""Egress decisions into the audit log: the proxy's sink (never blocks a proxied connection)."""

from __future__ import annotations

from sandboxd.audit.events import AuditEvent
from sandboxd.audit.writer import AuditWriter
from sandboxd.egress.audit import EgressEvent, EgressSink


def egress_sink(writer: AuditWriter) -> EgressSink:
    def record(tenant: str, e: EgressEvent) -> None:
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
