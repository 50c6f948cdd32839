"""What the reaper does at a lease's end, per the session's `on_expiry`.

Called by sessions.recovery under the session's lock, before its own expiry (remove the
container, state EXPIRED): returning True means the session was handled here (suspended).
A snapshot that cannot be taken never keeps a session alive: it is logged, said in the
`end_reason`, and the session expires as with DELETE.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

from sandboxd.errors import SandboxError
from sandboxd.leases.terms import SNAPSHOT_THEN_DELETE, SUSPEND, LeaseTermsStore
from sandboxd.models import Session, SessionState
from sandboxd.snapshot_store import Snapshot
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)

LABEL_EXPIRY = "io.sandboxd.expiry"


class Keeper(Protocol):
    async def take(self, session: Session, labels: dict[str, str]) -> Snapshot: ...


class Teardown(Protocol):
    """What of sessions.sandboxes.Sandboxes a suspension needs."""

    async def teardown(
        self, session: Session, *, quiet: bool = ..., keep_network: bool = ...
    ) -> None: ...

    async def release_network(self, session: Session) -> None: ...


class ExpiryPolicy:
    def __init__(
        self,
        terms: LeaseTermsStore,
        keeper: Keeper,
        store: SessionStore,
        *,
        suspend_for: timedelta,
        on_expired: Callable[[str], None] | None = None,
    ) -> None:
        self._on_expired = on_expired  # "delete", "suspend" or "snapshot": the metrics count
        self._terms = terms
        self._keeper = keeper
        self._store = store
        self._suspend_for = suspend_for

    async def __call__(self, session: Session, sandboxes: Teardown) -> bool:
        terms = await self._terms.get(session.session_id)
        reason, action = "lease expired", "delete"
        running = session.state is SessionState.RUNNING
        if terms.on_expiry in (SUSPEND, SNAPSHOT_THEN_DELETE) and running:
            try:
                snap = await self._keeper.take(session, {LABEL_EXPIRY: terms.on_expiry.lower()})
            except SandboxError as exc:
                log.warning(
                    "lease expired; snapshot failed, deleting: %s",
                    exc.message,
                    extra={"session_id": session.session_id},
                )
                reason = f"lease expired; snapshot failed ({exc.reason})"
            else:
                if terms.on_expiry == SUSPEND:
                    await self._suspend(session, sandboxes, snap)
                    self._expired("suspend")
                    return True
                reason, action = f"lease expired; snapshot {snap.snapshot_id} kept", "snapshot"
        await self._terms.set_end_reason(session.session_id, reason)
        await self._terms.forget_orphans()
        self._expired(action)
        return False

    def _expired(self, action: str) -> None:
        if self._on_expired is not None:
            self._on_expired(action)

    async def _suspend(self, session: Session, sandboxes: Teardown, snap: Snapshot) -> None:
        await sandboxes.teardown(session, quiet=False, keep_network=True)
        await sandboxes.release_network(session)
        session.state = SessionState.SUSPENDED
        session.container_id = ""
        # Resumable for a while: the lease is extended once; at its end it expires for good.
        session.lease_expires_at = datetime.now(UTC) + self._suspend_for
        await self._store.update(session)
        await self._terms.set_end_reason(
            session.session_id, f"lease expired; suspended (snapshot {snap.snapshot_id})"
        )
        log.info("lease expired: suspended", extra={"session_id": session.session_id})
