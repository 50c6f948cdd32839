"""Previews (SessionService.PublishPort, UnpublishPort, ListPorts): a session's ports over
the server's HTTP(S) preview listener, as a mixin of SandboxClient, with the typed `Preview`."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from sandboxd_client._convert import duration, timestamp
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import UNSET, rpc
from sandboxd_client._session_calls import SessionCalls

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import previews_pb2
else:  # loaded on first use (sandboxd_client._lazy)
    previews_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.previews_pb2")

TOKEN_HEADER = "X-Sandboxd-Token"


@dataclass(frozen=True)
class Preview:
    """A published port: `url` (host-routed, empty without a preview domain) and `path_url`
    (path-routed). `token` (PublishPort only; empty for a public preview) goes in header
    `X-Sandboxd-Token`, or once in query parameter `sandboxd_token`."""

    port: int
    url: str
    path_url: str
    token: str
    expires_at: dt.datetime | None
    public: bool = False

    @classmethod
    def from_pb(cls, msg: Any) -> Self:
        return cls(
            port=msg.port,
            url=msg.url,
            path_url=msg.path_url,
            token=msg.token,
            expires_at=timestamp(msg, "expires_at"),
            public=msg.public,
        )

    @property
    def headers(self) -> dict[str, str]:
        """The header that opens the preview (none for a public one)."""
        return {TOKEN_HEADER: self.token} if self.token else {}


class PreviewsMixin(SessionCalls):
    """SessionService's preview calls, a mixin of SandboxClient."""

    @rpc("SessionService/PublishPort")
    async def publish_port(
        self,
        session_id: str,
        port: int,
        *,
        ttl: float | None = None,
        public: bool = False,
        timeout: float | None = UNSET,
    ) -> Preview:
        """Publish `port` of the session: its URLs and a new token (`ttl` seconds, default
        one hour); older tokens of the port stop working."""
        req = previews_pb2.PublishPortRequest(
            session_id=session_id, port=port, ttl=duration(ttl), public=public
        )
        resp = await self._session_unary("PublishPort", req, timeout)
        return Preview.from_pb(resp.preview)

    @rpc("SessionService/UnpublishPort")
    async def unpublish_port(
        self, session_id: str, port: int, *, timeout: float | None = UNSET
    ) -> None:
        """Close the port's preview and revoke its tokens (PORT_NOT_PUBLISHED if it is not)."""
        req = previews_pb2.UnpublishPortRequest(session_id=session_id, port=port)
        await self._session_unary("UnpublishPort", req, timeout)

    @rpc("SessionService/ListPorts")
    async def list_ports(
        self, session_id: str, *, page_size: int = 0, timeout: float | None = UNSET
    ) -> AsyncIterator[Preview]:
        """The session's published ports, by port (tokens not included), following pages."""

        def request(token: str) -> Any:
            return previews_pb2.ListPortsRequest(
                session_id=session_id, page_size=page_size, page_token=token
            )

        async for preview in self._session_pages(
            "ListPorts", request, timeout, lambda resp: map(Preview.from_pb, resp.previews)
        ):
            yield preview


__all__ = ["TOKEN_HEADER", "Preview", "PreviewsMixin"]
