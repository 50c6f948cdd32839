"""The lease terms of the session RPCs: CreateSession takes `on_expiry` and
`renew_on_activity`, and every Session a call returns echoes them with `end_reason`.

`LeaseEcho` is a collaborator of the session RPCs (`session_lifecycle.py`), not an RPC
handler of its own: the terms ride on the Sessions the other RPCs return.
"""

from __future__ import annotations

from sandboxd.errors import InvalidArgument
from sandboxd.leases import DELETE, EXPIRY_ACTIONS, LeaseTermsStore
from sandboxd.reasons import Reason
from sandboxd.sessions import SessionManager
from sandboxd.v1 import leases_pb2, session_pb2

_FROM_PB: dict[int, str] = {
    leases_pb2.EXPIRY_ACTION_UNSPECIFIED: DELETE,
    **{leases_pb2.ExpiryAction.Value(f"EXPIRY_ACTION_{a}"): a for a in EXPIRY_ACTIONS},
}
_ENDED_WITHOUT_REASON: dict[int, str] = {
    session_pb2.SESSION_STATE_EXPIRED: "lease expired",
    session_pb2.SESSION_STATE_FAILED: "container lost",
}


def expiry_action(value: int) -> str:
    action = _FROM_PB.get(value)
    if action is None:
        raise InvalidArgument(
            f"on_expiry {value} is not an ExpiryAction this server knows",
            reason=Reason.INVALID_EXPIRY_ACTION,
        )
    return action


class LeaseEcho:
    def __init__(self, terms: LeaseTermsStore) -> None:
        self._terms = terms

    async def keep(self, s: session_pb2.Session, action: str, renew_on_activity: bool) -> None:
        """A new session's terms (`action` checked by `expiry_action` before it was created),
        stored and echoed on it."""
        await self._terms.set_terms(s.session_id, action, renew_on_activity)
        await self.echo(s)

    async def echo(self, s: session_pb2.Session) -> None:
        terms = await self._terms.get(s.session_id)
        s.on_expiry = leases_pb2.ExpiryAction.Value(f"EXPIRY_ACTION_{terms.on_expiry}")
        s.renew_on_activity = terms.renew_on_activity
        s.end_reason = terms.end_reason or _ENDED_WITHOUT_REASON.get(s.state, "")
        if s.state in (session_pb2.SESSION_STATE_RUNNING, session_pb2.SESSION_STATE_CREATING):
            s.end_reason = ""  # a resumed session runs again


async def renew_on_activity(
    sessions: SessionManager, terms: LeaseTermsStore, session_id: str
) -> None:
    """A command ran in the session: renew its lease by the default length if it asked."""
    if (await terms.get(session_id)).renew_on_activity:
        await sessions.renew(session_id, None)
