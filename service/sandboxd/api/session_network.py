"""The session RPCs of a session's network: UpdateNetworkPolicy and ListEgressEvents.

Proto <-> domain only (`SessionManager`); domain errors are mapped by the servicer
(`session_service.py`).
"""

from __future__ import annotations

from google.protobuf import field_mask_pb2

from sandboxd.api import convert, egress_convert, replies
from sandboxd.api.session_leases import LeaseEcho
from sandboxd.errors import InvalidArgument
from sandboxd.reasons import Reason
from sandboxd.sessions import SessionManager
from sandboxd.v1 import common_pb2, session_pb2


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


class SessionNetworkRpcs:
    """`leases`: the Session this answers with carries its lease terms like every other
    (API.md), not the defaults of an unset field."""

    def __init__(self, sessions: SessionManager, leases: LeaseEcho) -> None:
        self._sessions = sessions
        self._leases = leases

    async def UpdateNetworkPolicy(
        self, request: session_pb2.UpdateNetworkPolicyRequest
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
        answer = convert.session_pb(session)
        await self._leases.echo(answer)
        return session_pb2.UpdateNetworkPolicyResponse(session=answer)

    async def ListEgressEvents(
        self, request: session_pb2.ListEgressEventsRequest
    ) -> session_pb2.ListEgressEventsResponse:
        async def page(size: int) -> session_pb2.ListEgressEventsResponse:
            events, token = await self._sessions.egress_events(
                request.session_id, size, request.page_token
            )
            return session_pb2.ListEgressEventsResponse(
                events=[egress_convert.event_pb(e) for e in events], next_page_token=token
            )

        return await replies.fitted_page(page, "events", request.page_size)
