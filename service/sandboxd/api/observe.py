"""The metrics interceptor: latency of every RPC, and the output and archive bytes it carries.

An interceptor rather than the `unary`/`stream` error wrappers so that RPCs refused before a
servicer runs (authentication) and generic handlers (reflection) are measured too, and so the
metrics object arrives by construction instead of through a global.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from sandboxd import tenancy
from sandboxd.api.chain import Layer, rewrap
from sandboxd.logging_setup import CURRENT_SESSION
from sandboxd.metrics import Metrics


def status_code_of(context: Any) -> grpc.StatusCode | None:
    """The status a servicer context ended with (grpc.aio gives an enum or its number), or
    None before one is set."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int) and code != 0:
        for candidate in grpc.StatusCode:
            if candidate.value[0] == code:
                return candidate
    return None


# How a call ended when its context has no status: the code name it is counted under. A call
# the client cancelled (its task cancelled, its stream closed under it) is CANCELLED, not
# UNKNOWN: UNKNOWN is kept for a servicer's own unhandled failure.
OK, FAILED, CANCELLED = "OK", "UNKNOWN", "CANCELLED"


def _code_name(context: Any, outcome: str) -> str:
    """The status the call ended with, else its `outcome` (OK, FAILED or CANCELLED)."""
    code = status_code_of(context)
    return str(code.name) if code is not None else outcome


def _note_session(request: Any) -> None:
    """Log lines of this call name its session (each call runs in its own task)."""
    sid = getattr(request, "session_id", None)
    if isinstance(sid, str) and sid:
        CURRENT_SESSION.set(sid)


access = logging.getLogger("sandboxd.access")


class MetricsInterceptor(Layer):
    """Times each call until its reply (or last streamed message); counts output bytes, the
    calls in flight, and writes the access log: one INFO line per call with its method,
    tenant, session, code and duration (a line an operator greps before anything else)."""

    def __init__(self, metrics: Metrics, *, access_log: bool = True) -> None:
        self._access_log = access_log
        self._metrics = metrics
        self._stdout = metrics.exec_output_bytes.labels("stdout")
        self._stderr = metrics.exec_output_bytes.labels("stderr")
        self._exported = metrics.archive_bytes.labels("export")
        self._imported = metrics.archive_bytes.labels("import")
        self._kinds: dict[type[Message], str] = {}
        # Each method's gauge and histogram children, looked up once (labels() per call took
        # a lock and a dict lookup in the metrics library, twice per call).
        self._children: dict[str, tuple[Any, dict[str, Any]]] = {}

    def _of(self, method: str) -> tuple[Any, dict[str, Any]]:
        children = self._children.get(method)
        if children is None:
            children = (self._metrics.rpc_in_flight.labels(method), {})
            self._children[method] = children
        return children

    def wrap(self, handler: Any, handler_call_details: Any) -> Any:
        if handler is None:
            return None
        method = str(handler_call_details.method).lstrip("/").removeprefix("sandboxd.v1.")
        histogram = self._metrics.rpc_duration
        in_flight, by_code = self._of(method)
        count = self._count_output
        logged = self._access_log

        def observe(start: float, context: Any, outcome: str) -> None:
            in_flight.dec()
            code = _code_name(context, outcome)
            seconds = time.perf_counter() - start
            timer = by_code.get(code)
            if timer is None:
                timer = by_code[code] = histogram.labels(method, code)
            timer.observe(seconds)
            if logged:
                # The tenant was set inside the handler, in this same task's context.
                tenant = tenancy.current_tenant.get()
                access.info(
                    "%s %s %.1f ms",
                    method,
                    code,
                    seconds * 1000,
                    extra={
                        "rpc": method,
                        "tenant": tenant,
                        "code": code,
                        "duration_ms": round(seconds * 1000, 3),
                    },
                )

        def wrap_unary(behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            async def timed(request: Any, context: Any) -> Any:
                start = time.perf_counter()
                in_flight.inc()
                _note_session(request)
                outcome = FAILED
                try:
                    response = await behavior(request, context)
                    outcome = OK
                except asyncio.CancelledError:
                    outcome = CANCELLED
                    raise
                finally:
                    observe(start, context, outcome)
                if isinstance(response, Message):
                    count(response)
                return response

            return timed

        def wrap_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
            if inspect.iscoroutinefunction(behavior):
                return wrap_unary(behavior)  # a writer-style stream: time the coroutine

            async def timed(request: Any, context: Any) -> AsyncIterator[Any]:
                start = time.perf_counter()
                in_flight.inc()
                _note_session(request)
                outcome = FAILED
                try:
                    # aclosing: a cancelled call closes the inner stream at once (kills run).
                    async with contextlib.aclosing(behavior(request, context)) as items:
                        async for item in items:
                            if isinstance(item, Message):
                                count(item)
                            yield item
                    outcome = OK
                except (asyncio.CancelledError, GeneratorExit):
                    outcome = CANCELLED
                    raise
                finally:
                    observe(start, context, outcome)

            return timed

        def wrap(kind: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
            if kind.endswith("_stream"):
                return wrap_stream(behavior)
            if kind == "stream_unary":
                return wrap_unary(self._counting_requests(behavior))
            return wrap_unary(behavior)

        return rewrap(handler, wrap)

    def _counting_requests(
        self, behavior: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        """Client streams: count the tar bytes an ImportArchive call brings in."""
        imported = self._imported

        async def counted(requests: AsyncIterator[Any], context: Any) -> Any:
            async def passing() -> AsyncIterator[Any]:
                async for request in requests:
                    if isinstance(request, Message) and request.DESCRIPTOR.name == (
                        "ImportArchiveRequest"
                    ):
                        imported.inc(len(getattr(request, "data")))  # noqa: B009
                    yield request

            return await behavior(passing(), context)

        return counted

    def _count_output(self, message: Message) -> None:
        """Output events of Exec-like streams and the collected output of Run.

        Which kind a message type is gets decided once per type: this runs per streamed chunk.
        """
        kind = self._kinds.get(type(message))
        if kind is None:
            fields = message.DESCRIPTOR.fields_by_name
            chunk = fields.get("chunk")
            chunk_type = chunk.message_type if chunk is not None else None
            if chunk_type is not None and chunk_type.name == "ArchiveChunk":
                kind = "archive"  # ExportArchive and DownloadSnapshot responses
            elif "output" in fields:
                kind = "event"
            elif "stdout" in fields and "stderr" in fields and "exit_code" in fields:
                kind = "collected"
            else:
                kind = "other"
            self._kinds[type(message)] = kind
        if kind == "event":
            if message.HasField("output"):
                output: Any = getattr(message, "output")  # noqa: B009  # dynamic proto field
                data = output.data
                if data:
                    stderr = getattr(output, "stream", 1) == 2
                    (self._stderr if stderr else self._stdout).inc(len(data))
        elif kind == "archive":
            self._exported.inc(len(getattr(message, "chunk").data))  # noqa: B009
        elif kind == "collected":
            self._stdout.inc(len(getattr(message, "stdout")))  # noqa: B009
            self._stderr.inc(len(getattr(message, "stderr")))  # noqa: B009
