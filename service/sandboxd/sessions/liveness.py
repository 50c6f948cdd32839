"""Whether a session may still run: the one rule every operation checks before it uses one.

RUNNING and SUSPENDED pass; an ended lease is LEASE_EXPIRED even before the reaper has marked
it (reads never expire sessions themselves), a FAILED session is CONTAINER_LOST on every call,
not only the one that found out, and CREATING is SESSION_NOT_RUNNING.
"""

from __future__ import annotations

from sandboxd.errors import FailedPrecondition
from sandboxd.models import Session, SessionState
from sandboxd.reasons import Reason
from sandboxd.sessions.recovery import container_lost, now


def lease_ended(session: Session) -> bool:
    return session.state is not SessionState.EXPIRED and session.lease_expires_at <= now()


def require_live(session: Session) -> None:
    """Refuse a session that can no longer run: RUNNING and SUSPENDED pass."""
    if session.state is SessionState.EXPIRED or lease_ended(session):
        raise FailedPrecondition(
            f"the lease of session {session.session_id!r} expired; its container was removed",
            reason=Reason.LEASE_EXPIRED,
            metadata={"session_id": session.session_id},
        )
    if session.state is SessionState.FAILED:
        # Only a lost sandbox fails a session: say so on every later call too, not just on
        # the one that found out (reconcile may have been the one).
        raise container_lost(session.session_id)
    if session.state is SessionState.CREATING:
        raise FailedPrecondition(
            f"session {session.session_id!r} is still being created",
            reason=Reason.SESSION_NOT_RUNNING,
            metadata={"session_id": session.session_id, "state": session.state.value},
        )
