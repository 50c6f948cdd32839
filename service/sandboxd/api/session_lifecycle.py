"""The session RPCs of a session's life: create, read, list, renew, suspend, resume, delete.

Proto <-> domain only (`SessionManager`); every Session returned carries its lease terms
(`LeaseEcho`). Domain errors are mapped by the servicer (`session_service.py`).
"""

from __future__ import annotations

from sandboxd.api import convert, replies
from sandboxd.api.session_leases import LeaseEcho, expiry_action
from sandboxd.sessions import SessionManager
from sandboxd.v1 import session_pb2


class SessionLifecycleRpcs:
    def __init__(self, sessions: SessionManager, leases: LeaseEcho) -> None:
        self._sessions = sessions
        self._leases = leases

    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest
    ) -> session_pb2.CreateSessionResponse:
        action = expiry_action(request.on_expiry)  # refused before anything is created
        session = convert.session_pb(await self._sessions.create(convert.create_input(request)))
        await self._leases.keep(session, action, request.renew_on_activity)
        return session_pb2.CreateSessionResponse(session=session)

    async def GetSession(
        self, request: session_pb2.GetSessionRequest
    ) -> session_pb2.GetSessionResponse:
        session = convert.session_pb(await self._sessions.get(request.session_id))
        await self._leases.echo(session)
        return session_pb2.GetSessionResponse(session=session)

    async def ListSessions(
        self, request: session_pb2.ListSessionsRequest
    ) -> session_pb2.ListSessionsResponse:
        async def page(size: int) -> session_pb2.ListSessionsResponse:
            sessions, token = await self._sessions.list_sessions(
                dict(request.label_selector),
                size,
                request.page_token,
                convert.session_state(request.state),
            )
            response = session_pb2.ListSessionsResponse(
                sessions=[convert.session_pb(s) for s in sessions], next_page_token=token
            )
            for s in response.sessions:
                await self._leases.echo(s)
            return response

        return await replies.fitted_page(page, "sessions", request.page_size)

    async def RenewLease(
        self, request: session_pb2.RenewLeaseRequest
    ) -> session_pb2.RenewLeaseResponse:
        ttl = convert.optional_duration_s(request.ttl, request.HasField("ttl"))
        session = convert.session_pb(await self._sessions.renew(request.session_id, ttl))
        await self._leases.echo(session)
        return session_pb2.RenewLeaseResponse(session=session)

    async def DeleteSession(
        self, request: session_pb2.DeleteSessionRequest
    ) -> session_pb2.DeleteSessionResponse:
        existed = await self._sessions.delete(request.session_id)
        return session_pb2.DeleteSessionResponse(existed=existed)

    async def SuspendSession(
        self, request: session_pb2.SuspendSessionRequest
    ) -> session_pb2.SuspendSessionResponse:
        mode = convert.suspend_mode(request.mode)
        session = convert.session_pb(await self._sessions.suspend(request.session_id, mode))
        await self._leases.echo(session)
        return session_pb2.SuspendSessionResponse(session=session)

    async def ResumeSession(
        self, request: session_pb2.ResumeSessionRequest
    ) -> session_pb2.ResumeSessionResponse:
        expected = (
            request.expected_fingerprint if request.HasField("expected_fingerprint") else None
        )
        session = convert.session_pb(await self._sessions.resume(request.session_id, expected))
        await self._leases.echo(session)
        return session_pb2.ResumeSessionResponse(session=session)
