"""The server's interceptors as one chain: the handler is looked up once per call, then each
layer wraps it in turn, synchronously.

Every interceptor of the server had the same skeleton: `await continuation(details)`, then wrap
the handler it got back. gRPC runs a list of interceptors as nested coroutines, one await and
one continuation per layer per call; a `Layer` only says how it wraps (`wrap`), and `Chain`
awaits the lookup once and applies the layers innermost first, exactly the order the nested
form had. A layer used on its own (a test's server) is still an interceptor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

# A method handler's four behaviours (grpc.RpcMethodHandler), by the streaming of its request
# and of its response: exactly one of them is set.
KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
Behavior = Callable[..., Any]


def rewrap(handler: Any, wrap: Callable[[str, Behavior], Behavior | None]) -> Any:
    """`handler` with its behaviour replaced by `wrap(kind, behaviour)` (None: left as it
    is): the one place a layer finds which of the four kinds a method has, so a layer says
    only what it does to each."""
    for kind in KINDS:
        behavior = getattr(handler, kind)
        if behavior is not None:
            wrapped = wrap(kind, behavior)
            return handler if wrapped is None else handler._replace(**{kind: wrapped})
    return handler


class Layer(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """One interceptor's wrapping of a call's handler (None: no such method)."""

    def wrap(self, handler: Any, handler_call_details: Any) -> Any:
        raise NotImplementedError

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        handler = await continuation(handler_call_details)
        return None if handler is None else self.wrap(handler, handler_call_details)


class Chain(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """`layers` outermost first, as gRPC's `interceptors=` list would have them."""

    def __init__(self, layers: Sequence[Layer]) -> None:
        self._inner_first = tuple(reversed(layers))

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        handler = await continuation(handler_call_details)
        for layer in self._inner_first:
            if handler is None:
                return None
            handler = layer.wrap(handler, handler_call_details)
        return handler
