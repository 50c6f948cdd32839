"""SessionService: translate messages, delegate to SessionManager."""

from __future__ import annotations

from google.protobuf import field_mask_pb2

from sandboxd.api import convert, egress_convert
from sandboxd.api.errors import Ctx, unary
from sandboxd.errors import InvalidArgument
from sandboxd.reasons import Reason
from sandboxd.sessions import SessionManager
from sandboxd.v1 import common_pb2, session_pb2, session_pb2_grpc


def _masked(
    mask: field_mask_pb2.FieldMask,
    asked: common_pb2.NetworkPolicy,
    current: common_pb2.NetworkPolicy,
) -> common_pb2.NetworkPolicy:
    """The current policy with the masked fields taken from the request (AIP-134): a list in
    the mask is replaced whole, as are the quotas when "quotas" is named."""
    if not mask.IsValidForDescriptor(common_pb2.NetworkPolicy.DESCRIPTOR):
        raise InvalidArgument(
            f"update_mask names a field NetworkPolicy has not: {list(mask.paths)!r}",
            reason=Reason.NETWORK_POLICY_INVALID,
            metadata={"field": "update_mask"},
        )
    merged = common_pb2.NetworkPolicy()
    merged.CopyFrom(current)
    mask.MergeMessage(asked, merged, replace_message_field=True, replace_repeated_field=True)
    return merged


class SessionService(session_pb2_grpc.SessionServiceServicer):
    def __init__(self, sessions: SessionManager) -> None:
        self._sessions = sessions

    @unary
    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, context: Ctx
    ) -> session_pb2.CreateSessionResponse:
        session = await self._sessions.create(convert.create_input(request))
        return session_pb2.CreateSessionResponse(session=convert.session_pb(session))

    @unary
    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: Ctx
    ) -> session_pb2.GetSessionResponse:
        session = await self._sessions.get(request.session_id)
        return session_pb2.GetSessionResponse(session=convert.session_pb(session))

    @unary
    async def ListSessions(
        self, request: session_pb2.ListSessionsRequest, context: Ctx
    ) -> session_pb2.ListSessionsResponse:
        sessions, token = await self._sessions.list_sessions(
            dict(request.label_selector),
            request.page_size,
            request.page_token,
            convert.session_state(request.state),
        )
        return session_pb2.ListSessionsResponse(
            sessions=[convert.session_pb(s) for s in sessions], next_page_token=token
        )

    @unary
    async def RenewLease(
        self, request: session_pb2.RenewLeaseRequest, context: Ctx
    ) -> session_pb2.RenewLeaseResponse:
        ttl = convert.optional_duration_s(request.ttl, request.HasField("ttl"))
        session = await self._sessions.renew(request.session_id, ttl)
        return session_pb2.RenewLeaseResponse(session=convert.session_pb(session))

    @unary
    async def DeleteSession(
        self, request: session_pb2.DeleteSessionRequest, context: Ctx
    ) -> session_pb2.DeleteSessionResponse:
        existed = await self._sessions.delete(request.session_id)
        return session_pb2.DeleteSessionResponse(existed=existed)

    @unary
    async def SuspendSession(
        self, request: session_pb2.SuspendSessionRequest, context: Ctx
    ) -> session_pb2.SuspendSessionResponse:
        session = await self._sessions.suspend(request.session_id)
        return session_pb2.SuspendSessionResponse(session=convert.session_pb(session))

    @unary
    async def ResumeSession(
        self, request: session_pb2.ResumeSessionRequest, context: Ctx
    ) -> session_pb2.ResumeSessionResponse:
        expected = (
            request.expected_fingerprint if request.HasField("expected_fingerprint") else None
        )
        session = await self._sessions.resume(request.session_id, expected)
        return session_pb2.ResumeSessionResponse(session=convert.session_pb(session))

    @unary
    async def UpdateNetworkPolicy(
        self, request: session_pb2.UpdateNetworkPolicyRequest, context: Ctx
    ) -> session_pb2.UpdateNetworkPolicyResponse:
        network = request.network
        if request.HasField("update_mask") and request.update_mask.paths:
            network = _masked(
                request.update_mask,
                request.network,
                convert.session_pb(await self._sessions.get(request.session_id)).network,
            )
        session = await self._sessions.update_network_policy(
            request.session_id, convert.network_policy(network)
        )
        return session_pb2.UpdateNetworkPolicyResponse(session=convert.session_pb(session))

    @unary
    async def ListEgressEvents(
        self, request: session_pb2.ListEgressEventsRequest, context: Ctx
    ) -> session_pb2.ListEgressEventsResponse:
        events, token = await self._sessions.egress_events(
            request.session_id, request.page_size, request.page_token
        )
        return session_pb2.ListEgressEventsResponse(
            events=[egress_convert.event_pb(e) for e in events], next_page_token=token
        )
