"""Traces with OpenTelemetry: the tracer, and child spans for every engine and agent call.

The span per RPC is the gRPC edge's (`sandboxd.api.tracing`); this module stays below the
rooms that wrap their ports with `traced`.

The RPC span's parent is the caller's W3C `traceparent`, so a caller's trace continues through
the server into the engine. Spans are exported over OTLP/gRPC when `otlp_endpoint` is set;
otherwise the server records nothing (the API's no-op tracer keeps the caller's trace context,
which is all the audit log and the log lines need), at the cost of a few microseconds a call.

The tracer is an object passed to what needs it, not the process-wide provider: two servers in
one process (as in tests) keep their spans apart. The SDK (about 1 MiB of RSS) is loaded only
when spans are exported: without an endpoint only the API's no-op tracer is used.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from sandboxd import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

T = TypeVar("T")


def provider_for(endpoint: str, exporter: SpanExporter | None = None) -> TracerProvider | None:
    """A provider exporting to `endpoint` (OTLP/gRPC), or None when no endpoint is set.

    `exporter` replaces the OTLP one (tests hand in an in-memory exporter)."""
    if not endpoint and exporter is None:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        scheme, _, rest = endpoint.rpartition("://")
        exporter = OTLPSpanExporter(endpoint=rest.rstrip("/"), insecure=scheme == "http")
    provider = TracerProvider(
        resource=Resource.create({"service.name": "sandboxd", "service.version": __version__})
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def tracer_of(provider: TracerProvider | None) -> trace.Tracer:
    if provider is None:
        return trace.NoOpTracer()
    return provider.get_tracer("sandboxd", __version__)


class Traced:
    """Calls of an engine or agent port, each a CLIENT span named `<port>.<method>`.

    Coroutine methods are timed until they return; methods that give an async context manager
    (an exec stream) until it is left. Everything else (attributes, plain methods) passes
    through untouched, so the wrapped object keeps its whole interface.
    """

    def __init__(self, inner: Any, tracer: trace.Tracer, port: str) -> None:
        self._inner = inner
        self._tracer = tracer
        self._port = port

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._inner, name, value)  # a collaborator set later lands on the port

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name.startswith("_") or not callable(value):
            return value
        span_name = f"{self._port}.{name}"
        tracer = self._tracer
        if inspect.iscoroutinefunction(value):

            @functools.wraps(value)
            async def call(*args: Any, **kwargs: Any) -> Any:
                with tracer.start_as_current_span(span_name, kind=SpanKind.CLIENT):
                    return await value(*args, **kwargs)

            self.__dict__[name] = call  # wrapped once per method
            return call
        wrapped = getattr(value, "__wrapped__", None)
        if wrapped is not None and inspect.isasyncgenfunction(wrapped):

            @functools.wraps(value)
            @contextlib.asynccontextmanager
            async def opened(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                with tracer.start_as_current_span(span_name, kind=SpanKind.CLIENT):
                    async with value(*args, **kwargs) as inner:
                        yield inner

            self.__dict__[name] = opened
            return opened
        return value


def traced(inner: T, tracer: trace.Tracer, port: str) -> T:
    """`inner` with its calls traced, typed as itself (the wrapper has its whole interface)."""
    if isinstance(tracer, trace.NoOpTracer):
        return inner  # nothing would be recorded: keep the call path as it is
    wrapper: Any = Traced(inner, tracer, port)
    return wrapper  # type: ignore[no-any-return]
