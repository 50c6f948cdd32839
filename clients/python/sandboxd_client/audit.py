"""The audit log (AuditService): `SandboxClient.list_audit_events` and its result type.

A mixin of `SandboxClient`, kept in its own module so the feature's surface lives in one place.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

import grpc

from sandboxd_client._convert import timestamp
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import UNSET, rpc

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import audit_pb2, audit_pb2_grpc
else:  # loaded on first use (sandboxd_client._lazy)
    audit_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.audit_pb2")
    audit_pb2_grpc = lazy("sandboxd_client._gen.sandboxd.v1.audit_pb2_grpc")


@dataclass(frozen=True)
class AuditEvent:
    """One audited action: `kind` is e.g. "command", "file_write", "egress", "refused";
    `attributes` its details as text (lists such as argv are JSON)."""

    id: str
    time: dt.datetime | None
    tenant: str
    session_id: str
    kind: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    trace_id: str = ""

    @classmethod
    def from_pb(cls, msg: Any) -> Self:
        return cls(
            id=msg.id,
            time=timestamp(msg, "time"),
            tenant=msg.tenant,
            session_id=msg.session_id,
            kind=msg.kind,
            attributes=dict(msg.attributes),
            trace_id=msg.trace_id,
        )


def _ts(value: dt.datetime | None, target: Any) -> None:
    if value is not None:
        target.FromDatetime(value.astimezone(dt.UTC).replace(tzinfo=None))


class AuditMixin:
    """AuditService calls; the host class provides `channel` and `_paged`."""

    channel: grpc.aio.Channel
    _paged: Callable[..., AsyncIterator[Any]]

    @rpc("AuditService/ListAuditEvents")
    async def list_audit_events(
        self,
        *,
        session_id: str = "",
        kinds: Iterable[str] = (),
        start_time: dt.datetime | None = None,
        end_time: dt.datetime | None = None,
        tenant: str = "",
        page_size: int = 0,
        timeout: float | None = UNSET,
    ) -> AsyncIterator[AuditEvent]:
        """Audit events of the caller's tenant (an admin may name `tenant`), oldest first."""
        stub = audit_pb2_grpc.AuditServiceStub(self.channel)
        kinds = list(kinds)

        def call(token: str, t: float | None) -> Awaitable[Any]:
            req = audit_pb2.ListAuditEventsRequest(
                session_id=session_id,
                kinds=kinds,
                tenant=tenant,
                page_size=page_size,
                page_token=token,
            )
            _ts(start_time, req.start_time)
            _ts(end_time, req.end_time)
            return stub.ListAuditEvents(req, timeout=t)  # type: ignore[no-any-return]

        async for resp in self._paged("AuditService/ListAuditEvents", call, timeout):
            for event in resp.events:
                yield AuditEvent.from_pb(event)


__all__ = ["AuditEvent", "AuditMixin"]
