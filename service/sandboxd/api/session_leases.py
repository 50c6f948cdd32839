"""SessionService with lease terms: CreateSession takes `on_expiry` and `renew_on_activity`,
and every Session a call returns echoes them with `end_reason`.

A subclass of the event-streaming SessionService (itself a subclass of the plain one), so the
feature lives here and server.py registers this class.
"""

from __future__ import annotations

from sandboxd.api.errors import Ctx, unary
from sandboxd.api.session_events import WatchingSessionService
from sandboxd.errors import InvalidArgument
from sandboxd.events import EventHub
from sandboxd.events.stats import StatsReader
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


class LeaseSessionService(WatchingSessionService):
    def __init__(
        self, sessions: SessionManager, hub: EventHub, stats: StatsReader, terms: LeaseTermsStore
    ) -> None:
        super().__init__(sessions, hub, stats)
        self._terms = terms

    async def _echo(self, s: session_pb2.Session) -> None:
        terms = await self._terms.get(s.session_id)
        s.on_expiry = leases_pb2.ExpiryAction.Value(f"EXPIRY_ACTION_{terms.on_expiry}")
        s.renew_on_activity = terms.renew_on_activity
        s.end_reason = terms.end_reason or _ENDED_WITHOUT_REASON.get(s.state, "")
        if s.state in (session_pb2.SESSION_STATE_RUNNING, session_pb2.SESSION_STATE_CREATING):
            s.end_reason = ""  # a resumed session runs again

    @unary
    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, context: Ctx
    ) -> session_pb2.CreateSessionResponse:
        action = expiry_action(request.on_expiry)  # refused before anything is created
        response = await super().CreateSession(request, context)
        await self._terms.set_terms(response.session.session_id, action, request.renew_on_activity)
        await self._echo(response.session)
        return response

    @unary
    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: Ctx
    ) -> session_pb2.GetSessionResponse:
        response = await super().GetSession(request, context)
        await self._echo(response.session)
        return response

    @unary
    async def ListSessions(
        self, request: session_pb2.ListSessionsRequest, context: Ctx
    ) -> session_pb2.ListSessionsResponse:
        response = await super().ListSessions(request, context)
        for s in response.sessions:
            await self._echo(s)
        return response

    @unary
    async def RenewLease(
        self, request: session_pb2.RenewLeaseRequest, context: Ctx
    ) -> session_pb2.RenewLeaseResponse:
        response = await super().RenewLease(request, context)
        await self._echo(response.session)
        return response

    @unary
    async def ResumeSession(
        self, request: session_pb2.ResumeSessionRequest, context: Ctx
    ) -> session_pb2.ResumeSessionResponse:
        response = await super().ResumeSession(request, context)
        await self._echo(response.session)
        return response

    @unary
    async def SuspendSession(
        self, request: session_pb2.SuspendSessionRequest, context: Ctx
    ) -> session_pb2.SuspendSessionResponse:
        response = await super().SuspendSession(request, context)
        await self._echo(response.session)
        return response


async def renew_on_activity(
    sessions: SessionManager, terms: LeaseTermsStore, session_id: str
) -> None:
    """A command ran in the session: renew its lease by the default length if it asked."""
    if (await terms.get(session_id)).renew_on_activity:
        await sessions.renew(session_id, None)
