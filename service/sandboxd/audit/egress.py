"""The egress proxy's decisions as domain events: the proxy's sink emits, never blocking a
proxied connection; the audit log and the session's event feed subscribe (docs/architecture.md).
"""

from __future__ import annotations

from sandboxd import domain_events as de
from sandboxd.audit.subscriber import AuditSubscriber
from sandboxd.audit.writer import AuditWriter
from sandboxd.egress.audit import EgressEvent, EgressSink
from sandboxd.events.feed import FeedSubscriber
from sandboxd.events.hub import EventHub


def egress_into(observer: de.Observer) -> EgressSink:
    """Every decision (and secret injection) as an `EgressDecided` event."""

    def emit(tenant: str, e: EgressEvent) -> None:
        observer.emit(
            de.EgressDecided(
                tenant=tenant,
                session_id=e.session_id,
                time=e.time,
                kind=e.kind,
                method=e.method,
                host=e.host,
                port=e.port,
                allowed=e.allowed,
                reason=e.reason,
                address=e.address,
                secret=e.secret,
            )
        )

    return emit


def egress_sink(writer: AuditWriter, hub: EventHub | None = None) -> EgressSink:
    """The sink on its own (a proxy without the rest of the server): the audit log, and the
    session's feed when a hub is given."""
    subscribers: list[de.Subscriber] = [AuditSubscriber(writer)]
    if hub is not None:
        subscribers.append(FeedSubscriber(hub))
    return egress_into(de.FanOut(subscribers))
