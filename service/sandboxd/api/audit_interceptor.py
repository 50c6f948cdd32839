"""The audit edge: what is about the call itself, before it answers.

It sits inside authentication (the tenant is known) and outside the servicers, and does three
things no domain code can: it opens the call's `CallScope` (its method and the trace id of the
W3C `traceparent` in its metadata, also put in `CURRENT_TRACE` for its log lines), so the
records of the domain events the call causes carry them; it passes no outcome on before the
scope is settled, i.e. before the audit writer acknowledged each of those records (an answered
call's events survive a SIGKILL; one the log cannot take fails the call UNAVAILABLE); and any
refused call (any non-OK status) becomes a `CallRefused` event, with its code and reason,
whose record is acknowledged before the status reaches the caller. It reads nothing off the
call's messages but the session they name (a refusal's); what a call did is the domain's to
tell (a command's record: the process manager's `CommandStarted` and `CommandExited`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from sandboxd import domain_events as de
from sandboxd import tenancy
from sandboxd.api.chain import Layer, rewrap
from sandboxd.api.errors import abort
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


def _refusal(context: Any, session_id: str) -> de.CallRefused:
    """Code, reason and message of a failed call, read from the status it was aborted with."""
    name = "UNKNOWN"
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode):
        name = code.name
    elif isinstance(code, int) and code:
        name = next((c.name for c in grpc.StatusCode if c.value[0] == code), str(code))
    reason = message = ""
    for key, value in context.trailing_metadata() or ():
        if key == _STATUS_DETAILS and isinstance(value, bytes):
            with contextlib.suppress(Exception):
                status = status_pb2.Status.FromString(value)
                message = status.message
                for detail in status.details:
                    info = error_details_pb2.ErrorInfo()
                    if detail.Unpack(info):
                        reason = info.reason
    return de.CallRefused(tenancy.current(), session_id, name, reason, message)


class _Named:
    """The session a call names, read off its requests: the session of its refusal."""

    def __init__(self) -> None:
        self.session_id = ""

    def note(self, request: Any) -> None:
        if self.session_id:
            return
        sid = getattr(request, "session_id", None)
        if isinstance(sid, str):
            self.session_id = sid
        elif hasattr(request, "HasField") and _has(request, "start"):
            self.session_id = request.start.request.session_id  # Interact's first message


def _has(message: Any, name: str) -> bool:
    try:
        return bool(message.HasField(name))
    except ValueError:  # no such field
        return False


class AuditInterceptor(Layer):
    def __init__(self, observer: de.Observer) -> None:
        self._observer = observer

    def wrap(self, handler: Any, handler_call_details: Any) -> Any:
        if handler is None:
            return None
        full = str(handler_call_details.method).lstrip("/")
        if not full.startswith("sandboxd.v1."):
            return handler  # health and reflection: nothing to audit
        method = full.removeprefix("sandboxd.v1.")
        trace = trace_id_of(handler_call_details.invocation_metadata)
        call = _Call(self._observer, method, trace)
        return rewrap(handler, call.wrap)


class _Call:
    """The wrappers of one RPC method's handler (made per call: method and trace are fixed)."""

    def __init__(self, observer: de.Observer, method: str, trace: str) -> None:
        self.observer = observer
        self.method = method
        self.trace = trace

    def begin(self) -> tuple[_Named, de.CallScope]:
        # Each RPC runs in its own task (its own context copy): this cannot leak into another.
        if self.trace:
            CURRENT_TRACE.set(self.trace)
        scope = de.CallScope(self.method, self.trace)
        de.CURRENT_SCOPE.set(scope)
        return _Named(), scope

    def wrap(self, kind: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        """The wrapper of the method's kind (chain.rewrap)."""
        if kind == "unary_unary":
            return self.unary(behavior)
        if kind == "stream_unary":
            return self.client_stream(behavior)
        return self.server_stream(behavior, kind == "stream_stream")

    async def settled(self, context: Any, scope: de.CallScope) -> None:
        """The records of the call's events so far are committed; if the audit log cannot take
        them, the call fails UNAVAILABLE (an unrecorded action must not look recorded)."""
        if not scope.pending:
            return  # the common case, per streamed message too: nothing to wait for
        try:
            await scope.settle()
        except SandboxError as exc:
            await abort(context, exc)

    async def refused(
        self, named: _Named, scope: de.CallScope, context: Any, exc: BaseException
    ) -> None:
        """The refusal's record, with what the call did before it failed, committed before
        the status goes out (the call's own error stands if the log cannot take them)."""
        if isinstance(exc, GeneratorExit | asyncio.CancelledError):
            return  # the caller went away: not a refusal (a command's kill is its own record)
        self.observer.emit(_refusal(context, named.session_id))
        try:
            await scope.settle()
        except SandboxError as failure:
            log.error("audit: a refusal could not be recorded: %s", failure.message)

    async def answer(
        self, named: _Named, scope: de.CallScope, context: Any, call: Awaitable[Any]
    ) -> Any:
        """The one answer of a unary or client-streaming call: a refusal is recorded, else the
        records of the call's events are acknowledged before the answer goes out."""
        try:
            response = await call
        except BaseException as exc:
            await self.refused(named, scope, context, exc)
            raise
        await self.settled(context, scope)
        return response

    def unary(self, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def audited_unary(request: Any, context: Any) -> Any:
            named, scope = self.begin()
            try:
                named.note(request)
                return await self.answer(named, scope, context, behavior(request, context))
            finally:
                scope.close()

        return audited_unary

    def client_stream(
        self, behavior: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        async def audited_client_stream(requests: AsyncIterator[Any], context: Any) -> Any:
            named, scope = self.begin()
            try:
                call = behavior(_noted(requests, named), context)
                return await self.answer(named, scope, context, call)
            finally:
                scope.close()

        return audited_client_stream

    def server_stream(self, behavior: Callable[..., Any], streaming: bool) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(behavior):
            return self.unary(behavior)  # a writer-style stream (context.write): its outcome only

        async def audited_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            named, scope = self.begin()
            try:
                if streaming:
                    request = _noted(request, named)
                else:
                    named.note(request)
                try:
                    async with contextlib.aclosing(behavior(request, context)) as items:
                        async for item in items:
                            # What the item tells (an Exec's `exited`) is recorded before the
                            # caller sees it: its events were emitted before it was yielded.
                            await self.settled(context, scope)
                            yield item
                except BaseException as exc:
                    await self.refused(named, scope, context, exc)
                    raise
                await self.settled(context, scope)
            finally:
                scope.close()

        return audited_stream


async def _noted(requests: AsyncIterator[Any], named: _Named) -> AsyncIterator[Any]:
    async for request in requests:
        named.note(request)
        yield request
