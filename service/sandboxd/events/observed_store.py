"""The session store, publishing what it records: state changes and lease renewals.

Every path that changes a session (create, suspend, resume, the reaper's expiry, recovery's
lost container, delete) writes it through the store, so observing the store covers them all
with no hook in each path. The event is published after the write returned: a watcher never
hears of a change the store does not have.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sandboxd.events.hub import EventHub
from sandboxd.models import Session
from sandboxd.store import SessionStore


def state_name(session: Session) -> str:
    return f"SESSION_STATE_{session.state.value}"


class ObservedStore(SessionStore):
    def __init__(
        self, path: Path, hub: EventHub, on_change: Callable[[Session], None] | None = None
    ) -> None:
        super().__init__(path)
        self._hub = hub
        self._on_change = on_change  # every state change (the audit log of the server's own)
        # What was last published per session: (state, lease end), to tell changes apart.
        self._seen: dict[str, tuple[str, float]] = {}

    def _observe(self, s: Session) -> None:
        state, lease = s.state.value, s.lease_expires_at.timestamp()
        before = self._seen.get(s.session_id)
        self._seen[s.session_id] = (state, lease)
        self._hub.note_labels(s.session_id, s.labels)
        if before is None or before[0] != state:
            self._hub.publish(s.tenant, s.session_id, "STATE_CHANGED", state=state_name(s))
            if self._on_change is not None:
                self._on_change(s)
        elif lease > before[1]:
            self._hub.publish(
                s.tenant,
                s.session_id,
                "LEASE_RENEWED",
                state=state_name(s),
                expires_at=s.lease_expires_at.isoformat(),
            )

    async def insert(self, s: Session) -> None:
        await super().insert(s)
        self._observe(s)

    async def update(self, s: Session) -> None:
        await super().update(s)
        self._observe(s)

    async def delete(self, session_id: str) -> None:
        current = await self.get(session_id)
        await super().delete(session_id)
        self._seen.pop(session_id, None)
        if current is not None:
            self._hub.publish(
                current.tenant, session_id, "STATE_CHANGED", message="deleted", deleted="true"
            )
        self._hub.forget(session_id)
