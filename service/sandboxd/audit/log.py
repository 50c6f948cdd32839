"""Reading the audit log back: the tenant scope, the filters and the page token of a listing."""

from __future__ import annotations

from collections.abc import Iterable

from sandboxd import paging
from sandboxd.audit.events import KINDS, AuditEvent, AuditQuery
from sandboxd.audit.store import AuditStore
from sandboxd.errors import InvalidArgument, PermissionDenied
from sandboxd.reasons import Reason


class AuditLog:
    def __init__(self, store: AuditStore | None) -> None:
        self._store = store

    async def list(
        self,
        *,
        caller: str,
        caller_is_admin: bool,
        tenant: str = "",
        session_id: str = "",
        kinds: Iterable[str] = (),
        start_time: float | None = None,
        end_time: float | None = None,
        page_size: int = 0,
        page_token: str = "",
    ) -> tuple[list[AuditEvent], str]:
        """One page of events, oldest first, and the token of the next page ("" at the end)."""
        if tenant and tenant != caller and not caller_is_admin:
            raise PermissionDenied(
                "only an admin tenant may read another tenant's audit events",
                reason=Reason.AUDIT_TENANT_NOT_ALLOWED,
            )
        wanted = frozenset(kinds)
        if unknown := sorted(wanted - KINDS):
            raise InvalidArgument(
                f"unknown audit event kind(s) {unknown}; known: {sorted(KINDS)}",
                reason=Reason.INVALID_AUDIT_KIND,
            )
        if start_time is not None and end_time is not None and end_time < start_time:
            raise InvalidArgument("end_time is before start_time", reason=Reason.INVALID_TIME_RANGE)
        limit = paging.page_size(page_size)
        after = paging.decode_token(page_token, lambda key: key.isdigit() and len(key) < 20)
        if self._store is None:
            return [], ""
        query = AuditQuery(
            tenant=tenant or caller,
            session_id=session_id,
            kinds=wanted,
            start_time=start_time,
            end_time=end_time,
            after_id=int(after or 0),
            limit=limit + 1,
        )
        events = await self._store.list(query)
        if len(events) > limit:
            events = events[:limit]
            return events, paging.encode_token(str(events[-1].id))
        return events, ""
