"""AuditService: translate ListAuditEvents to the audit log's listing and back."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from sandboxd import tenancy
from sandboxd.api import replies
from sandboxd.api.errors import Ctx, unary
from sandboxd.api.pb_time import time_pb
from sandboxd.audit import AuditEvent, AuditLog
from sandboxd.v1 import audit_pb2, audit_pb2_grpc


def _time(ts: timestamp_pb2.Timestamp, present: bool) -> float | None:
    return ts.seconds + ts.nanos / 1e9 if present else None


def audit_event_pb(e: AuditEvent) -> audit_pb2.AuditEvent:
    return audit_pb2.AuditEvent(
        id=str(e.id),
        time=time_pb(e.time),
        tenant=e.tenant,
        session_id=e.session_id,
        kind=e.kind,
        attributes=dict(e.attributes),
        trace_id=e.trace_id,
    )


class AuditService(audit_pb2_grpc.AuditServiceServicer):
    def __init__(self, log: AuditLog) -> None:
        self._log = log

    @unary
    async def ListAuditEvents(
        self, request: audit_pb2.ListAuditEventsRequest, context: Ctx
    ) -> audit_pb2.ListAuditEventsResponse:
        caller, admin = tenancy.current(), tenancy.current_grants().admin

        async def page(size: int) -> audit_pb2.ListAuditEventsResponse:
            events, token = await self._log.list(
                caller=caller,
                caller_is_admin=admin,
                tenant=request.tenant,
                session_id=request.session_id,
                kinds=request.kinds,
                start_time=_time(request.start_time, request.HasField("start_time")),
                end_time=_time(request.end_time, request.HasField("end_time")),
                page_size=size,
                page_token=request.page_token,
            )
            return audit_pb2.ListAuditEventsResponse(
                events=[audit_event_pb(e) for e in events], next_page_token=token
            )

        return await replies.fitted_page(page, "events", request.page_size)
