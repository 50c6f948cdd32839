"""The audit interceptor: one place where every audited call becomes an event before it answers.

It sits inside authentication (the tenant is known) and outside the servicers: a successful
audited call's event (see `audit_describe`) is committed before its outcome reply is passed on,
and any refused call (any non-OK status) is a `refused` event with its code and reason before
the status reaches the caller. It also takes the W3C `traceparent` of the call's metadata into
`CURRENT_TRACE`, so the call's log lines and events carry its trace id.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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
from sandboxd.audit.context import CURRENT_CALL
from sandboxd.errors import SandboxError
from sandboxd.events import EventHub
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
    def __init__(
        self,
        writer: AuditWriter,
        hashers: concurrent.futures.Executor,
        hub: EventHub | None = None,
        on_activity: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._writer = writer
        self._hashers = hashers  # the server's (audit_describe.hashing_threads)
        self._hub = hub
        self._on_activity = on_activity  # a command ran: renew_on_activity

    def wrap(self, handler: Any, handler_call_details: Any) -> Any:
        if handler is None:
            return None
        full = str(handler_call_details.method).lstrip("/")
        if not full.startswith("sandboxd.v1."):
            return handler  # health and reflection: nothing to audit
        method = full.removeprefix("sandboxd.v1.")
        trace = trace_id_of(handler_call_details.invocation_metadata)
        call = _Call(self._writer, self._hashers, self._hub, method, trace, self._on_activity)
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

    def __init__(
        self,
        writer: AuditWriter,
        hashers: concurrent.futures.Executor,
        hub: EventHub | None,
        method: str,
        trace: str,
        on_activity: Callable[[str], Awaitable[None]] | None,
    ) -> None:
        self.writer = writer
        self.hashers = hashers
        self.hub = hub
        self.on_activity = on_activity
        self.method = method
        self.trace = trace
        self.audited = audited(method)

    def begin(self) -> Tally:
        # Each RPC runs in its own task (its own context copy): this cannot leak into another.
        if self.trace:
            CURRENT_TRACE.set(self.trace)
        CURRENT_CALL.set(self.method)
        return Tally(self.method, self.hashers)

    def processes(self, tally: Tally, exited: bool) -> None:
        """Process started/exited on the session's event feed (after the audit record)."""
        if self.hub is None or tally.kind != "command":
            return
        tenant = tenancy.current()
        if tally.started:
            self.hub.publish(
                tenant,
                tally.session_id,
                "PROCESS_STARTED",
                process_id=tally.started,
                argv=tally.attributes.get("argv"),
            )
            tally.started = ""
        if exited:
            a = tally.attributes
            self.hub.publish(
                tenant,
                tally.session_id,
                "PROCESS_EXITED",
                process_id=a.get("process_id"),
                exit_code=a.get("exit_code"),
                signal=a.get("signal"),
                timed_out=a.get("timed_out"),
            )

    async def activity(self, tally: Tally) -> None:
        if self.on_activity is None or tally.kind != "command" or not tally.session_id:
            return
        try:
            await self.on_activity(tally.session_id)
        except SandboxError as exc:  # the command's answer stands; the renewal is best effort
            log.info("renew on activity: %s", exc.message)

    async def commit(self, context: Any, tally: Tally) -> None:
        """The call's event, committed before its answer; if the audit log cannot take it,
        the call fails UNAVAILABLE (an unrecorded action must not look recorded)."""
        try:
            await tally.settle()
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

    async def refused(self, tally: Tally, context: Any, exc: BaseException) -> None:
        if isinstance(exc, GeneratorExit | asyncio.CancelledError):
            return  # the caller went away: not a refusal (a command's kill is its own record)
        try:
            await self.record("refused", tally.session_id, _refusal(context))
        except SandboxError as failure:  # the call's own error stands
            log.error("audit: a refusal could not be recorded: %s", failure.message)

    def unary(self, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def audited_unary(request: Any, context: Any) -> Any:
            tally = self.begin()
            await tally.request(request)
            try:
                response = await behavior(request, context)
            except BaseException as exc:
                await self.refused(tally, context, exc)
                raise
            if self.audited and await tally.reply(response):
                await self.commit(context, tally)
                self.processes(tally, exited="exit_code" in tally.attributes)
                await self.activity(tally)
            return response

        return audited_unary

    def client_stream(
        self, behavior: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        async def audited_client_stream(requests: AsyncIterator[Any], context: Any) -> Any:
            tally = self.begin()
            try:
                response = await behavior(_tallied(requests, tally), context)
            except BaseException as exc:
                await self.refused(tally, context, exc)
                raise
            if self.audited and await tally.reply(response):
                await self.commit(context, tally)
            return response

        return audited_client_stream

    def server_stream(self, behavior: Callable[..., Any], streaming: bool) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(behavior):
            return self.unary(behavior)  # a writer-style stream (context.write): its outcome only

        async def audited_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            tally = self.begin()
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
                            await self.commit(context, tally)
                            self.processes(tally, exited=True)
                            await self.activity(tally)
                        elif tally.started:
                            self.processes(tally, exited=False)
                        yield item
            except BaseException as exc:
                await self.refused(tally, context, exc)
                raise
            if not done:
                tally.ended()
                await self.commit(context, tally)

        return audited_stream


async def _tallied(requests: AsyncIterator[Any], tally: Tally) -> AsyncIterator[Any]:
    async for request in requests:
        await tally.request(request)
        yield request
