"""Why a session is in a state that is not the plain course of things (Session.state_reason):
the reason its calls are refused with, and whether any call can bring it back.

Derived from the record alone: a session only FAILS when its container was lost with no
snapshot to rebuild it from (recovery.py), and only EXPIRES when its lease ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sandboxd.models import Session, SessionState
from sandboxd.reasons import Reason


@dataclass(frozen=True)
class StateReason:
    reason: Reason
    message: str
    recoverable: bool


def state_reason(session: Session, now: datetime | None = None) -> StateReason | None:
    now = now or datetime.now(tz=UTC)
    if session.state is SessionState.FAILED:
        return StateReason(
            Reason.CONTAINER_LOST,
            "the container was lost and no snapshot could rebuild it (its workspace was a "
            "tmpfs): the session never runs again",
            recoverable=False,
        )
    if session.state is SessionState.EXPIRED or session.lease_expires_at <= now:
        return StateReason(
            Reason.LEASE_EXPIRED,
            "the lease ended and the container was removed: the session never runs again",
            recoverable=False,
        )
    return None
