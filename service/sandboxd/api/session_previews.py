"""SessionService's previews: PublishPort, UnpublishPort, ListPorts (proto <-> domain only).

A subclass of the lease-aware SessionService, so the feature lives in one module; server.py
registers this class. The domain is `sandboxd.previews.publishing.Previews`.
"""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from sandboxd.api import convert
from sandboxd.api.errors import Ctx, unary
from sandboxd.api.session_leases import LeaseSessionService
from sandboxd.events import EventHub
from sandboxd.events.stats import StatsReader
from sandboxd.leases import LeaseTermsStore
from sandboxd.previews.publishing import Preview, Previews
from sandboxd.sessions import SessionManager
from sandboxd.v1 import previews_pb2


def preview_pb(p: Preview) -> previews_pb2.Preview:
    expires = timestamp_pb2.Timestamp()
    expires.FromNanoseconds(int(p.expires_at * 1e9))
    return previews_pb2.Preview(
        port=p.port,
        url=p.url,
        path_url=p.path_url,
        token=p.token,
        expires_at=expires,
        public=p.public,
    )


class PreviewSessionService(LeaseSessionService):
    def __init__(
        self,
        sessions: SessionManager,
        hub: EventHub,
        stats: StatsReader,
        terms: LeaseTermsStore,
        previews: Previews,
    ) -> None:
        super().__init__(sessions, hub, stats, terms)
        self._previews = previews

    @unary
    async def PublishPort(
        self, request: previews_pb2.PublishPortRequest, context: Ctx
    ) -> previews_pb2.PublishPortResponse:
        ttl = convert.optional_duration_s(request.ttl, request.HasField("ttl"))
        preview = await self._previews.publish(
            request.session_id, request.port, ttl, request.public
        )
        return previews_pb2.PublishPortResponse(preview=preview_pb(preview))

    @unary
    async def UnpublishPort(
        self, request: previews_pb2.UnpublishPortRequest, context: Ctx
    ) -> previews_pb2.UnpublishPortResponse:
        await self._previews.unpublish(request.session_id, request.port)
        return previews_pb2.UnpublishPortResponse()

    @unary
    async def ListPorts(
        self, request: previews_pb2.ListPortsRequest, context: Ctx
    ) -> previews_pb2.ListPortsResponse:
        previews, token = await self._previews.list_ports(
            request.session_id, request.page_size, request.page_token
        )
        return previews_pb2.ListPortsResponse(
            previews=[preview_pb(p) for p in previews], next_page_token=token
        )
