"""The web gateway: Connect and gRPC-Web requests, answered by the gRPC server itself.

Each request becomes one gRPC call on a channel to the server's own private socket, so every
call passes the same interceptors as a call on the gRPC port (authentication by the caller's
bearer token, tenancy, stream caps and idle guards, audit, metrics, reply limits) and reaches
the same servicers: the gateway translates framing and nothing else. It holds no session state.

Bounds of its own: the request body (`web_max_request_bytes`, refused with 413 before it is
read past the cap), the time a body may take and a connection may idle (`web_idle_timeout`),
the calls in flight (`web_max_calls`), and CORS (`web_allowed_origins`): a request from any
other browser origin is refused, and only credentials and trace context pass on as metadata.
A caller that goes away cancels its call, and so the command it ran.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc
from aiohttp import web

from sandboxd import connect
from sandboxd.config_sections.web import WebSection, origins
from sandboxd.listener_caps import ConnectionCaps, listening
from sandboxd.web.methods import CodecError, Method
from sandboxd.web.protocols import (
    CONNECT_UNARY,
    GRPC_WEB,
    Protocol,
    ProtocolError,
    check_connect_version,
    deadline_of,
    forwarded_metadata,
    protocol_of,
)

log = logging.getLogger("sandboxd.web")

ALLOWED_HEADERS = (
    "authorization, content-type, connect-protocol-version, connect-timeout-ms, grpc-timeout, "
    "x-grpc-web, x-user-agent, traceparent, tracestate"
)
EXPOSED_HEADERS = "grpc-status, grpc-message, grpc-status-details-bin, sandboxd-watch"

Metadata = Sequence[tuple[str, str | bytes]]


class WebGateway:
    """The gateway's listener; `async with` serves it, leaving closes it."""

    def __init__(
        self,
        settings: WebSection,
        upstream: str,
        methods: Mapping[str, Method],
        *,
        tls: ssl.SSLContext | None = None,
        max_message_bytes: int = 4 << 20,
    ) -> None:
        self._settings = settings
        self._upstream = upstream
        self._methods = methods
        self._tls = tls
        self._max_message = max_message_bytes
        self._origins = frozenset(origins(settings.allowed_origins))
        self._in_flight = 0  # calls past the checks, body read or being answered
        self._channel: grpc.aio.Channel | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def __aenter__(self) -> WebGateway:
        self._channel = grpc.aio.insecure_channel(
            self._upstream,
            options=[
                ("grpc.max_receive_message_length", self._max_message),
                ("grpc.max_send_message_length", self._max_message),
            ],
        )
        app = web.Application(client_max_size=self._settings.max_request_bytes)
        app.router.add_route("*", "/{service}/{method}", self._handle)
        self._runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,  # a caller that leaves cancels its call
            keepalive_timeout=self._settings.idle_timeout_s,
        )
        await self._runner.setup()
        settings = self._settings
        caps = ConnectionCaps("web gateway", settings.max_clients, settings.max_clients_per_source)
        sock = listening(settings.listen, "web_listen", caps)
        site = web.SockSite(self._runner, sock, ssl_context=self._tls)
        await site.start()
        host = settings.listen.rpartition(":")[0]
        self.port = int(self._runner.addresses[0][1])
        scheme = "https" if self._tls else "http"
        log.info("web gateway (Connect, gRPC-Web) at %s://%s:%d", scheme, host, self.port)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._channel is not None:
            await self._channel.close()

    # -- one request --

    def _cors(self, origin: str | None) -> dict[str, str] | None:
        """The CORS headers for `origin`; None when it may not call (no Origin: no headers)."""
        if origin is None:
            return {}
        if "*" in self._origins or origin.rstrip("/").lower() in self._origins:
            return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        cors = self._cors(request.headers.get("Origin"))
        if cors is None:
            return web.Response(status=403, text="origin not allowed (web_allowed_origins)\n")
        if request.method == "OPTIONS":
            return web.Response(
                status=204,
                headers={
                    **cors,
                    "Access-Control-Allow-Methods": "POST",
                    "Access-Control-Allow-Headers": ALLOWED_HEADERS,
                    "Access-Control-Max-Age": "600",
                },
            )
        if request.method != "POST":
            return web.Response(status=405, headers={**cors, "Allow": "POST, OPTIONS"})
        protocol = protocol_of(request.headers.get("Content-Type", ""))
        if protocol is None:
            return web.Response(status=415, headers={**cors, "Accept-Post": _ACCEPTED})
        headers = {k.lower(): v for k, v in request.headers.items()}
        reply = _Reply(request, protocol, {**cors, "Access-Control-Expose-Headers": _exposed()})
        method = self._methods.get(request.path)
        if self._in_flight >= self._settings.max_calls:
            return await reply.error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "the web gateway's calls are all in use",
                None,
                (),
            )
        self._in_flight += 1  # taken before the body is read: no more than max_calls wait on one
        try:
            return await self._serve(request, method, protocol, headers, reply)
        finally:
            self._in_flight -= 1

    async def _serve(
        self,
        request: web.Request,
        method: Method | None,
        protocol: Protocol,
        headers: dict[str, str],
        reply: _Reply,
    ) -> web.StreamResponse:
        try:
            check_connect_version(protocol, headers)
            timeout = deadline_of(protocol, headers)
            if method is None or method.client_streaming:
                what = "no such method" if method is None else "a client-streaming method"
                raise _Refusal(
                    grpc.StatusCode.UNIMPLEMENTED,
                    f"{request.path}: {what} over the web gateway (use the gRPC port)",
                )
            if protocol.kind == CONNECT_UNARY and method.server_streaming:
                return web.Response(
                    status=415, headers={**reply.headers, "Accept-Post": _STREAMING}
                )
            body = await self._body(request, protocol)
            payload = method.request_bytes(body, protocol.codec)
        except _Refusal as refusal:
            return await reply.error(refusal.code, refusal.message, None, ())
        except (ProtocolError, CodecError) as exc:
            return await reply.error(grpc.StatusCode.INVALID_ARGUMENT, str(exc), None, ())
        return await self._call(method, payload, forwarded_metadata(headers), timeout, reply)

    async def _body(self, request: web.Request, protocol: Protocol) -> bytes:
        """The one request message, unframed; bounded in size and in time."""
        if (
            request.content_length is not None
            and request.content_length > self._settings.max_request_bytes
        ):
            raise web.HTTPRequestEntityTooLarge(
                max_size=self._settings.max_request_bytes, actual_size=request.content_length
            )
        try:
            raw = await asyncio.wait_for(request.read(), self._settings.idle_timeout_s)
        except TimeoutError:
            raise web.HTTPRequestTimeout() from None
        if protocol.text:
            try:
                raw = base64.b64decode(raw, validate=False)
            except ValueError:
                raise _Refusal(grpc.StatusCode.INVALID_ARGUMENT, "the body is not base64") from None
        if protocol.kind == CONNECT_UNARY:
            return raw
        reader = connect.EnvelopeReader(self._settings.max_request_bytes, flags=0)
        try:
            frames = list(reader.feed(raw))
            reader.close()
        except connect.FramingError as exc:
            raise _Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if len(frames) != 1:
            raise _Refusal(
                grpc.StatusCode.INVALID_ARGUMENT, f"expected one request message, got {len(frames)}"
            )
        return frames[0][1]

    async def _call(
        self,
        method: Method,
        payload: bytes,
        metadata: list[tuple[str, str]],
        timeout: float | None,
        reply: _Reply,
    ) -> web.StreamResponse:
        assert self._channel is not None
        if not method.server_streaming:
            unary = self._channel.unary_unary(method.path)
            call = unary(payload, metadata=metadata, timeout=timeout)
            try:
                data: bytes = await call
            except grpc.aio.AioRpcError as err:
                return await reply.error(
                    err.code(), err.details() or "", err.initial_metadata(), err.trailing_metadata()
                )
            return await reply.unary(
                method.response_body(data, reply.protocol.codec),
                await call.initial_metadata(),
                await call.trailing_metadata(),
            )
        stream = self._channel.unary_stream(method.path)(
            payload, metadata=metadata, timeout=timeout
        )
        try:
            try:
                await reply.start(await stream.initial_metadata())
                async for message in stream:
                    await reply.message(method.response_body(message, reply.protocol.codec))
            except grpc.aio.AioRpcError as err:
                return await reply.error(
                    err.code(), err.details() or "", err.initial_metadata(), err.trailing_metadata()
                )
            return await reply.finish(await stream.trailing_metadata())
        finally:
            stream.cancel()  # a caller that left (or any failure here) ends the command


_ACCEPTED = (
    "application/proto, application/json, application/connect+proto, application/connect+json, "
    "application/grpc-web+proto, application/grpc-web+json, application/grpc-web-text+proto"
)
_STREAMING = "application/connect+proto, application/connect+json"


def _exposed() -> str:
    return EXPOSED_HEADERS + ", content-type"


class _Refusal(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _header_pairs(metadata: Any) -> list[tuple[str, str]]:
    """gRPC metadata as HTTP header pairs (binary values base64, as gRPC-Web and Connect say)."""
    pairs = []
    for key, value in metadata or ():
        if key.startswith("grpc-"):
            continue
        text = base64.b64encode(value).decode() if isinstance(value, bytes) else str(value)
        pairs.append((key, text))
    return pairs


class _Reply:
    """One request's answer in its protocol: unary body, Connect stream or gRPC-Web body."""

    def __init__(self, request: web.Request, protocol: Protocol, headers: dict[str, str]) -> None:
        self.request, self.protocol, self.headers = request, protocol, headers
        self._response: web.StreamResponse | None = None

    async def unary(self, body: bytes, initial: Any, trailing: Any) -> web.StreamResponse:
        if self.protocol.kind == CONNECT_UNARY:
            response = web.Response(
                body=body, headers={**self.headers, "Content-Type": self.protocol.content_type}
            )
            for k, v in _header_pairs(initial):
                response.headers.add(k, v)
            for k, v in _header_pairs(trailing):
                response.headers.add("trailer-" + k, v)
            return response
        await self.start(initial)
        await self.message(body)
        return await self.finish(trailing)

    async def start(self, initial: Any) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200, headers={**self.headers, "Content-Type": self.protocol.content_type}
        )
        for k, v in _header_pairs(initial):
            response.headers.add(k, v)
        await response.prepare(self.request)
        self._response = response
        return response

    async def message(self, body: bytes) -> None:
        assert self._response is not None
        await self._write(connect.envelope(body))

    async def _write(self, frame: bytes) -> None:
        assert self._response is not None
        await self._response.write(base64.b64encode(frame) if self.protocol.text else frame)

    async def finish(self, trailing: Any) -> web.StreamResponse:
        return await self._end(grpc.StatusCode.OK, "", None, trailing)

    async def error(
        self, code: grpc.StatusCode, message: str, initial: Any, trailing: Any
    ) -> web.StreamResponse:
        details = connect.status_details(trailing or ())
        if self.protocol.kind == CONNECT_UNARY:
            response = web.Response(
                status=connect.HTTP_STATUS.get(code, 500),
                body=json.dumps(connect.connect_error(code, message, details)).encode(),
                headers={**self.headers, "Content-Type": "application/json"},
            )
            for k, v in _header_pairs(initial):
                response.headers.add(k, v)
            return response
        if self._response is None:
            await self.start(initial)
        return await self._end(code, message, details, trailing)

    async def _end(
        self, code: grpc.StatusCode, message: str, details: Any, trailing: Any
    ) -> web.StreamResponse:
        assert self._response is not None
        if self.protocol.kind == GRPC_WEB:
            extra = _header_pairs(trailing)
            if details is not None:
                extra.append(
                    (
                        "grpc-status-details-bin",
                        base64.b64encode(details.SerializeToString()).decode(),
                    )
                )
            await self._write(connect.grpc_web_trailers(code, message, extra))
        else:
            error = (
                None
                if code == grpc.StatusCode.OK
                else connect.connect_error(code, message, details)
            )
            metadata: dict[str, list[str]] = {}
            for k, v in _header_pairs(trailing):
                metadata.setdefault(k, []).append(v)
            await self._write(connect.end_stream(error, metadata))
        await self._response.write_eof()
        return self._response
