"""SessionService: the one servicer of `sandboxd.v1.SessionService`, assembled from the
handlers of its concerns.

Each concern owns its RPCs and its collaborators in its own module: a session's life
(`session_lifecycle.py`, with the lease terms of `session_leases.py`), its network
(`session_network.py`), its events and stats (`session_events.py`), its previews
(`session_previews.py`). This class only routes each RPC to its handler and maps domain
errors to gRPC statuses (`unary`, `stream`), so no handler depends on another's class.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from sandboxd.api.errors import Ctx, stream, unary
from sandboxd.api.session_events import SessionEventRpcs
from sandboxd.api.session_lifecycle import SessionLifecycleRpcs
from sandboxd.api.session_network import SessionNetworkRpcs
from sandboxd.api.session_previews import SessionPreviewRpcs
from sandboxd.v1 import events_pb2, previews_pb2, session_pb2, session_pb2_grpc


class SessionService(session_pb2_grpc.SessionServiceServicer):
    def __init__(
        self,
        lifecycle: SessionLifecycleRpcs,
        network: SessionNetworkRpcs,
        events: SessionEventRpcs,
        previews: SessionPreviewRpcs,
    ) -> None:
        self._lifecycle = lifecycle
        self._network = network
        self._events = events
        self._previews = previews

    # ----- a session's life (session_lifecycle.py) ------------------------------------------

    @unary
    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, context: Ctx
    ) -> session_pb2.CreateSessionResponse:
        return await self._lifecycle.CreateSession(request)

    @unary
    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: Ctx
    ) -> session_pb2.GetSessionResponse:
        return await self._lifecycle.GetSession(request)

    @unary
    async def ListSessions(
        self, request: session_pb2.ListSessionsRequest, context: Ctx
    ) -> session_pb2.ListSessionsResponse:
        return await self._lifecycle.ListSessions(request)

    @unary
    async def RenewLease(
        self, request: session_pb2.RenewLeaseRequest, context: Ctx
    ) -> session_pb2.RenewLeaseResponse:
        return await self._lifecycle.RenewLease(request)

    @unary
    async def DeleteSession(
        self, request: session_pb2.DeleteSessionRequest, context: Ctx
    ) -> session_pb2.DeleteSessionResponse:
        return await self._lifecycle.DeleteSession(request)

    @unary
    async def SuspendSession(
        self, request: session_pb2.SuspendSessionRequest, context: Ctx
    ) -> session_pb2.SuspendSessionResponse:
        return await self._lifecycle.SuspendSession(request)

    @unary
    async def ResumeSession(
        self, request: session_pb2.ResumeSessionRequest, context: Ctx
    ) -> session_pb2.ResumeSessionResponse:
        return await self._lifecycle.ResumeSession(request)

    # ----- its network (session_network.py) -------------------------------------------------

    @unary
    async def UpdateNetworkPolicy(
        self, request: session_pb2.UpdateNetworkPolicyRequest, context: Ctx
    ) -> session_pb2.UpdateNetworkPolicyResponse:
        return await self._network.UpdateNetworkPolicy(request)

    @unary
    async def ListEgressEvents(
        self, request: session_pb2.ListEgressEventsRequest, context: Ctx
    ) -> session_pb2.ListEgressEventsResponse:
        return await self._network.ListEgressEvents(request)

    # ----- its events and stats (session_events.py) -----------------------------------------

    @stream
    def WatchSession(
        self, request: events_pb2.WatchSessionRequest, context: Ctx
    ) -> AsyncGenerator[events_pb2.WatchSessionResponse, None]:
        return self._events.WatchSession(request)

    @stream
    def WatchSessions(
        self, request: events_pb2.WatchSessionsRequest, context: Ctx
    ) -> AsyncGenerator[events_pb2.WatchSessionsResponse, None]:
        return self._events.WatchSessions(request)

    @unary
    async def GetSessionStats(
        self, request: events_pb2.GetSessionStatsRequest, context: Ctx
    ) -> events_pb2.GetSessionStatsResponse:
        return await self._events.GetSessionStats(request)

    # ----- its previews (session_previews.py) -----------------------------------------------

    @unary
    async def PublishPort(
        self, request: previews_pb2.PublishPortRequest, context: Ctx
    ) -> previews_pb2.PublishPortResponse:
        return await self._previews.PublishPort(request)

    @unary
    async def UnpublishPort(
        self, request: previews_pb2.UnpublishPortRequest, context: Ctx
    ) -> previews_pb2.UnpublishPortResponse:
        return await self._previews.UnpublishPort(request)

    @unary
    async def ListPorts(
        self, request: previews_pb2.ListPortsRequest, context: Ctx
    ) -> previews_pb2.ListPortsResponse:
        return await self._previews.ListPorts(request)
