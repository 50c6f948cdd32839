"""What SandboxClient's mixins of SessionService calls (previews.py, watch.py) share: the host
class's call helpers, declared once, and a unary, a server-streaming and a paged SessionService
call by method name, each answer converted to the mixin's typed result."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from sandboxd_client._lazy import lazy

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import session_pb2_grpc
else:  # loaded on first use (sandboxd_client._lazy)
    session_pb2_grpc = lazy("sandboxd_client._gen.sandboxd.v1.session_pb2_grpc")

T = TypeVar("T")


class SessionCalls:
    """Base of a SessionService mixin; the host class (SandboxClient) provides `channel`,
    `_unary`, `_server_stream` and `_paged` (version check, deadline, typed errors, retries)."""

    channel: grpc.aio.Channel
    _unary: Callable[..., Awaitable[Any]]
    _server_stream: Callable[..., AsyncIterator[Any]]
    _paged: Callable[..., AsyncIterator[Any]]

    def _session_method(self, name: str) -> Callable[..., Any]:
        return getattr(session_pb2_grpc.SessionServiceStub(self.channel), name)  # type: ignore[no-any-return]

    async def _session_unary(self, name: str, req: Any, timeout: float | None) -> Any:
        """SessionService/`name` with `req`: its response."""
        method = self._session_method(name)
        return await self._unary(
            f"SessionService/{name}", lambda t: method(req, timeout=t), timeout
        )

    async def _session_stream(
        self, name: str, req: Any, timeout: float | None, convert: Callable[[Any], T]
    ) -> AsyncIterator[T]:
        """The responses of server-streaming SessionService/`name`, each `convert`ed; leaving
        the loop early cancels the call."""
        method = self._session_method(name)
        async for resp in self._server_stream(lambda t: method(req, timeout=t), timeout):
            yield convert(resp)

    async def _session_pages(
        self,
        name: str,
        request: Callable[[str], Any],
        timeout: float | None,
        items: Callable[[Any], Iterable[T]],
    ) -> AsyncIterator[T]:
        """The `items` of every page of SessionService/`name` (`request(page_token)`)."""
        method = self._session_method(name)
        async for resp in self._paged(
            f"SessionService/{name}", lambda token, t: method(request(token), timeout=t), timeout
        ):
            for item in items(resp):
                yield item
