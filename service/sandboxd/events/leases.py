"""Lease warnings: a LEASE_EXPIRING event a configurable time before each lease ends.

Once per lease end: a renewal moves the end, and the new end gets its own warning.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from sandboxd.events.hub import EventHub
from sandboxd.events.observed_store import state_name
from sandboxd.models import SessionState
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)


class LeaseWarner:
    def __init__(self, store: SessionStore, hub: EventHub, warning_s: float) -> None:
        self._store = store
        self._hub = hub
        self._warning_s = warning_s
        self._warned: dict[str, float] = {}  # session -> the lease end already warned of

    async def check_once(self) -> int:
        now = datetime.now(UTC)
        horizon = now + timedelta(seconds=self._warning_s)
        due = set(await self._store.due_for_expiry(horizon))
        sent = 0
        for session_id in due:
            s = await self._store.get(session_id)
            if s is None or s.state in (SessionState.EXPIRED, SessionState.FAILED):
                continue
            end = s.lease_expires_at.timestamp()
            if self._warned.get(session_id) == end or s.lease_expires_at <= now:
                continue
            self._warned[session_id] = end
            left = (s.lease_expires_at - now).total_seconds()
            self._hub.publish(
                s.tenant,
                session_id,
                "LEASE_EXPIRING",
                state=state_name(s),
                message=f"the lease ends in {left:.0f} s",
                expires_at=s.lease_expires_at.isoformat(),
                expires_in_s=f"{left:.1f}",
            )
            sent += 1
        for gone in set(self._warned) - due:
            del self._warned[gone]
        return sent

    async def run(self, interval_s: float) -> None:
        while True:
            try:
                await self.check_once()
            except Exception:
                log.exception("lease warning check failed")
            await asyncio.sleep(interval_s)
