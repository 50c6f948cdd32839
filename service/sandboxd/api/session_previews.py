"""SessionService's previews: PublishPort, UnpublishPort, ListPorts (proto <-> domain only).

The domain is `sandboxd.previews.publishing.Previews`; domain errors are mapped by the
servicer (`session_service.py`).
"""

from __future__ import annotations

from sandboxd.api import convert, replies
from sandboxd.api.pb_time import time_pb
from sandboxd.previews.publishing import Preview, Previews
from sandboxd.v1 import previews_pb2


def preview_pb(p: Preview) -> previews_pb2.Preview:
    return previews_pb2.Preview(
        port=p.port,
        url=p.url,
        path_url=p.path_url,
        token=p.token,
        expires_at=time_pb(p.expires_at),
        public=p.public,
    )


class SessionPreviewRpcs:
    def __init__(self, previews: Previews) -> None:
        self._previews = previews

    async def PublishPort(
        self, request: previews_pb2.PublishPortRequest
    ) -> previews_pb2.PublishPortResponse:
        ttl = convert.optional_duration_s(request.ttl, request.HasField("ttl"))
        preview = await self._previews.publish(
            request.session_id, request.port, ttl, request.public
        )
        return previews_pb2.PublishPortResponse(preview=preview_pb(preview))

    async def UnpublishPort(
        self, request: previews_pb2.UnpublishPortRequest
    ) -> previews_pb2.UnpublishPortResponse:
        await self._previews.unpublish(request.session_id, request.port)
        return previews_pb2.UnpublishPortResponse()

    async def ListPorts(
        self, request: previews_pb2.ListPortsRequest
    ) -> previews_pb2.ListPortsResponse:
        async def page(size: int) -> previews_pb2.ListPortsResponse:
            previews, token = await self._previews.list_ports(
                request.session_id, size, request.page_token
            )
            return previews_pb2.ListPortsResponse(
                previews=[preview_pb(p) for p in previews], next_page_token=token
            )

        return await replies.fitted_page(page, "previews", request.page_size)
