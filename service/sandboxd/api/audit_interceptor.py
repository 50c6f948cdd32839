"""The audit edge: what is about the call itself, before it answers.

It sits inside authentication (the tenant is known) and outside the servicers, and does three
things no domain code can: it opens the call's `CallScope` (its method and the trace id of the
W3C `traceparent` in its metadata, also put in `CURRENT_TRACE` for its log lines), so the
records of the domain events the call causes carry them; it passes no outcome on before the
scope is settled, i.e. before the audit writer acknowledged each of those records (an answered
call's events survive a SIGKILL; one the log cannot take fails the call UNAVAILABLE); and any
refused call (any non-OK status) becomes a `refused` record with its code and reason before the
status reaches the caller. The records whose attributes are still read off the call's own
messages (a command's output bytes) are described in `audit_describe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from sandboxd import tenancy
from sandboxd.api.audit_describe import Tally, audited
from sandboxd.api.chain import Layer
from sandboxd.api.errors import abort
from sandboxd.audit import AuditEvent, AuditWriter
from sandboxd.domain_events import CURRENT_SCOPE, CallScope
from sandboxd.errors import SandboxError
from sandboxd.logging_setup import CURRENT_TRACE

# version-traceid-parentid-flags; an all-zero trace id is invalid (W3C Trace Context, 3.2).
_TRACEPARENT = re.compile(r"\A[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}\Z")
_STATUS_DETAILS = "grpc-status-details-bin"

log = logging.getLogger(__name__)


def trace_id_of(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == "traceparent" and isinstance(value, str):
            match = _TRACEPARENT.match(value.strip().lower())
            if match and match.group(1) != "0" * 32:
                return match.group(1)
    return ""


def _refusal(context: Any) -> dict[str, object]:
    """Code, reason and message of a failed call, read from the status it was aborted with."""
    attrs: dict[str, object] = {}
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode):
        attrs["code"] = code.name
    elif isinstance(code, int) and code:
        attrs["code"] = next((c.name for c in grpc.StatusCode if c.value[0] == code), str(code))
    for key, value in context.trailing_metadata() or ():
        if key == _STATUS_DETAILS and isinstance(value, bytes):
            with contextlib.suppress(Exception):
                status = status_pb2.Status.FromString(value)
                attrs["message"] = status.message
                for detail in status.details:
                    info = error_details_pb2.ErrorInfo()
                    if detail.Unpack(info):
                        attrs["reason"] = info.reason
    attrs.setdefault("code", "UNKNOWN")
    return attrs


class AuditInterceptor(Layer):
    def __init__(self, writer: AuditWriter) -> None:
        self._writer = writer

    def wrap(self, handler: Any, handler_call_details: Any) -> Any:
        if handler is None:
            return None
        full = str(handler_call_details.method).lstrip("/")
        if not full.startswith("sandboxd.v1."):
            return handler  # health and reflection: nothing to audit
        method = full.removeprefix("sandboxd.v1.")
        trace = trace_id_of(handler_call_details.invocation_metadata)
        call = _Call(self._writer, method, trace)
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=call.unary(handler.unary_unary))
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=call.client_stream(handler.stream_unary))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=call.server_stream(handler.unary_stream, False))
        if handler.stream_stream is not None:
            return handler._replace(stream_stream=call.server_stream(handler.stream_stream, True))
        return handler


class _Call:
    """The wrappers of one RPC method's handler (made per call: method and trace are fixed)."""

    def __init__(self, writer: AuditWriter, method: str, trace: str) -> None:
        self.writer = writer
        self.method = method
        self.trace = trace
        self.audited = audited(method)

    def begin(self) -> tuple[Tally, CallScope]:
        # Each RPC runs in its own task (its own context copy): this cannot leak into another.
        if self.trace:
            CURRENT_TRACE.set(self.trace)
        scope = CallScope(self.method, self.trace)
        CURRENT_SCOPE.set(scope)
        return Tally(self.method), scope

    async def settled(self, context: Any, scope: CallScope) -> None:
        """The records of the call's events so far are committed; if the audit log cannot take
        them, the call fails UNAVAILABLE (an unrecorded action must not look recorded)."""
        if not scope.pending:
            return  # the common case, per streamed message too: nothing to wait for
        try:
            await scope.settle()
        except SandboxError as exc:
            await abort(context, exc)

    async def commit(self, context: Any, tally: Tally, scope: CallScope) -> None:
        """The call's own record and its events', committed before its answer."""
        await self.settled(context, scope)
        try:
            await self.record(tally.kind, tally.session_id, tally.attributes)
        except SandboxError as exc:
            await abort(context, exc)

    async def record(self, kind: str, session_id: str, attrs: dict[str, object]) -> None:
        await self.writer.record(
            AuditEvent.of(
                kind,
                time=time.time(),
                tenant=tenancy.current(),
                session_id=session_id,
                trace_id=self.trace,
                method=self.method,
                **attrs,
            )
        )

    async def refused(
        self, tally: Tally, scope: CallScope, context: Any, exc: BaseException
    ) -> None:
        if isinstance(exc, GeneratorExit | asyncio.CancelledError):
            return  # the caller went away: not a refusal (a command's kill is its own record)
        try:
            with contextlib.suppress(SandboxError):  # what it did before it failed, recorded
                await scope.settle()
            await self.record("refused", tally.session_id, _refusal(context))
        except SandboxError as failure:  # the call's own error stands
            log.error("audit: a refusal could not be recorded: %s", failure.message)

    async def answer(
        self, tally: Tally, scope: CallScope, context: Any, call: Awaitable[Any]
    ) -> Any:
        """The one answer of a unary or client-streaming call: a refusal is recorded, else the
        call's record (or its domain events) is acknowledged before the answer goes out."""
        try:
            response = await call
        except BaseException as exc:
            await self.refused(tally, scope, context, exc)
            raise
        if self.audited and await tally.reply(response):
            await self.commit(context, tally, scope)
        else:
            await self.settled(context, scope)
        return response

    def unary(self, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def audited_unary(request: Any, context: Any) -> Any:
            tally, scope = self.begin()
            try:
                await tally.request(request)
                return await self.answer(tally, scope, context, behavior(request, context))
            finally:
                scope.close()

        return audited_unary

    def client_stream(
        self, behavior: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        async def audited_client_stream(requests: AsyncIterator[Any], context: Any) -> Any:
            tally, scope = self.begin()
            try:
                call = behavior(_tallied(requests, tally), context)
                return await self.answer(tally, scope, context, call)
            finally:
                scope.close()

        return audited_client_stream

    def server_stream(self, behavior: Callable[..., Any], streaming: bool) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(behavior):
            return self.unary(behavior)  # a writer-style stream (context.write): its outcome only

        async def audited_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            tally, scope = self.begin()
            try:
                if streaming:
                    request = _tallied(request, tally)
                else:
                    await tally.request(request)
                done = not self.audited
                try:
                    async with contextlib.aclosing(behavior(request, context)) as items:
                        async for item in items:
                            if not done and await tally.reply(item):
                                done = True  # the outcome: recorded before the caller sees it
                                await self.commit(context, tally, scope)
                            else:
                                await self.settled(context, scope)
                            yield item
                except BaseException as exc:
                    await self.refused(tally, scope, context, exc)
                    raise
                if not done:
                    await self.commit(context, tally, scope)
                else:
                    await self.settled(context, scope)
            finally:
                scope.close()

        return audited_stream


async def _tallied(requests: AsyncIterator[Any], tally: Tally) -> AsyncIterator[Any]:
    async for request in requests:
        await tally.request(request)
        yield request
