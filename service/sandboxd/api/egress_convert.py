"""Proto <-> domain conversion of the egress allowlist: proxy quotas, audit events."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf import duration_pb2

from sandboxd import validation
from sandboxd.api.pb_time import duration_pb, time_pb
from sandboxd.egress.audit import EgressEvent
from sandboxd.models import ProxyQuotas, SecretBinding
from sandboxd.v1 import common_pb2, secrets_pb2, session_pb2


def _seconds(value: duration_pb2.Duration) -> float | None:
    seconds = validation.duration_seconds(value.seconds, value.nanos)
    return seconds if seconds != 0 else None


def quotas(pb: common_pb2.ProxyQuotas) -> ProxyQuotas:
    """Zero fields become None ("the server's default"); negative durations stay negative."""
    return ProxyQuotas(
        max_connections=pb.max_connections or None,
        max_dns_lookups=pb.max_dns_lookups or None,
        max_requests=pb.max_requests or None,
        # The *_bytes twins win; the deprecated names still answer.
        max_bytes_up=pb.max_up_bytes or pb.max_bytes_up or None,
        max_bytes_down=pb.max_down_bytes or pb.max_bytes_down or None,
        idle_timeout_s=_seconds(pb.idle_timeout),
        tunnel_lifetime_s=_seconds(pb.tunnel_lifetime),
        header_timeout_s=_seconds(pb.header_timeout),
    )


def quotas_pb(q: ProxyQuotas) -> common_pb2.ProxyQuotas:
    return common_pb2.ProxyQuotas(
        max_connections=q.max_connections or 0,
        max_dns_lookups=q.max_dns_lookups or 0,
        max_requests=q.max_requests or 0,
        max_bytes_up=q.max_bytes_up or 0,
        max_bytes_down=q.max_bytes_down or 0,
        max_up_bytes=q.max_bytes_up or 0,
        max_down_bytes=q.max_bytes_down or 0,
        idle_timeout=duration_pb(q.idle_timeout_s or 0),
        tunnel_lifetime=duration_pb(q.tunnel_lifetime_s or 0),
        header_timeout=duration_pb(q.header_timeout_s or 0),
    )


def event_pb(e: EgressEvent) -> session_pb2.EgressEvent:
    return session_pb2.EgressEvent(
        seq=e.seq,
        time=time_pb(e.time),
        method=e.method,
        host=e.host,
        port=e.port,
        verdict=(
            session_pb2.EGRESS_VERDICT_ALLOWED if e.allowed else session_pb2.EGRESS_VERDICT_REFUSED
        ),
        reason=e.reason,
        address=e.address,
        bytes_up=e.bytes_up,
        bytes_down=e.bytes_down,
        up_bytes=e.bytes_up,
        down_bytes=e.bytes_down,
        duration=duration_pb(e.duration_s),
        ended=e.ended,
        kind=e.kind,
        secret=e.secret,
    )


def secrets(pbs: Sequence[secrets_pb2.SecretBinding]) -> tuple[SecretBinding, ...]:
    return tuple(
        SecretBinding(
            name=pb.name,
            hosts=tuple(pb.hosts),
            header=pb.header,
            template=pb.template,
            secret_ref=pb.secret_ref,
            value=pb.value or None,
        )
        for pb in pbs
    )


def secrets_pb(bindings: Sequence[SecretBinding]) -> list[secrets_pb2.SecretBinding]:
    """Values are write-only: never in an answer, sealed or not."""
    return [
        secrets_pb2.SecretBinding(
            name=b.name,
            hosts=list(b.hosts),
            header=b.header,
            template=b.template,
            secret_ref=b.secret_ref,
        )
        for b in bindings
    ]
