"""The session store, publishing what it records: state changes and lease renewals.

Every path that changes a session (create, suspend, resume, the reaper's expiry, recovery's
lost container, delete) writes it through the store, so observing the store covers them all
with no hook in each path. The event is published after the write returned: a watcher never
hears of a change the store does not have.
"""

from __future__ import annotations

from pathlib import Path

from sandboxd import domain_events
from sandboxd.events.hub import EventHub
from sandboxd.models import Loss, Session
from sandboxd.store import SessionStore


def loss_attributes(loss: Loss) -> dict[str, str]:
    """The event's message and attributes of a sandbox's death (models.Loss)."""
    attrs = {"message": loss.message(), "lost_time": loss.lost_at.isoformat()}
    if loss.restored_at is not None and loss.snapshot_at is not None:
        attrs |= {
            "restored_from": loss.snapshot_id,
            "restored_state_time": loss.snapshot_at.isoformat(),
        }
    return attrs


def state_name(session: Session) -> str:
    return f"SESSION_STATE_{session.state.value}"


class ObservedStore(SessionStore):
    def __init__(
        self,
        path: Path,
        hub: EventHub,
        observer: domain_events.Observer = domain_events.SILENT,
    ) -> None:
        super().__init__(path)
        self._hub = hub
        self._observer = observer  # every state change (the audit log of the server's own)
        # What was last published per session: (state, lease end, loss), to tell changes apart.
        self._seen: dict[str, tuple[str, float, Loss | None]] = {}

    def _observe(self, s: Session) -> None:
        state, lease = s.state.value, s.lease_expires_at.timestamp()
        before = self._seen.get(s.session_id)
        self._seen[s.session_id] = (state, lease, s.loss)
        self._hub.note_labels(s.session_id, s.labels)
        if before is None or before[0] != state:
            # A death or a rebuild after one says what was lost and how old what came back is.
            told = s.loss is not None and (before is None or before[2] != s.loss)
            extra = loss_attributes(s.loss) if told and s.loss is not None else {}
            self._hub.publish(s.tenant, s.session_id, "STATE_CHANGED", state=state_name(s), **extra)
            self._observer.emit(domain_events.SessionChanged(s.tenant, s.session_id, s.state.value))
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
