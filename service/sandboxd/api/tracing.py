"""The SERVER span of each RPC: the gRPC edge's part of tracing (`sandboxd.tracing` holds the
tracer and the spans of the engine and agent ports).

The span's parent is the caller's W3C `traceparent` in the call's metadata, so a caller's trace
continues through the server into the engine.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sandboxd.api.chain import Layer, rewrap
from sandboxd.api.observe import status_code_of

_PROPAGATOR = TraceContextTextMapPropagator()


class _Metadata(Getter[Any]):
    """gRPC invocation metadata as the propagator reads it (keys are lower-case already)."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        values = [v for k, v in carrier or () if k == key and isinstance(v, str)]
        return values or None

    def keys(self, carrier: Any) -> list[str]:
        return [k for k, _ in carrier or ()]


_METADATA = _Metadata()


class TracingInterceptor(Layer):
    """A SERVER span around each call, the current span while its handler runs."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def wrap(self, handler: Any, handler_call_details: Any) -> Any:
        if handler is None:
            return None
        full = str(handler_call_details.method).lstrip("/")
        service, _, method = full.partition("/")
        parent = _PROPAGATOR.extract(handler_call_details.invocation_metadata, getter=_METADATA)
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        tracer = self._tracer

        @contextlib.contextmanager
        def spanned(context: Any) -> Iterator[None]:
            """The call's span, current while it runs; its status is the call's (an error
            too when the handler raised, or its stream was closed early)."""
            span, error = tracer.start_span(full, parent, SpanKind.SERVER, attributes), None
            try:
                with trace.use_span(span, end_on_exit=False):
                    yield
            except BaseException as exc:
                error = exc
                raise
            finally:
                code = status_code_of(context)
                if code is not None:
                    span.set_attribute("rpc.grpc.status_code", code.value[0])
                if error is not None or (code is not None and code is not grpc.StatusCode.OK):
                    span.set_status(
                        Status(StatusCode.ERROR, code.name if code else type(error).__name__)
                    )
                span.end()

        def unary(behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            async def traced(request: Any, context: Any) -> Any:
                with spanned(context):
                    return await behavior(request, context)

            return traced

        def streaming(behavior: Callable[..., Any]) -> Callable[..., Any]:
            if inspect.iscoroutinefunction(behavior):
                return unary(behavior)

            async def traced(request: Any, context: Any) -> AsyncIterator[Any]:
                with spanned(context):
                    async with contextlib.aclosing(behavior(request, context)) as items:
                        async for item in items:
                            yield item

            return traced

        return rewrap(
            handler, lambda kind, b: streaming(b) if kind.endswith("_stream") else unary(b)
        )
