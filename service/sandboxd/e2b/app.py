"""The door's ASGI application: which request is REST and which is envd, and how each is
answered.

envd's requests name their sandbox by the `E2b-Sandbox-Id` header (the SDK's E2B_SANDBOX_URL
mode) or by the host `49983-<sandbox>.<domain>`; they authenticate with the sandbox's
`X-Access-Token` (`tokens.py`). REST requests authenticate with `X-API-KEY`. Either way the
credential becomes the bearer token of the gRPC calls that do the work (`backend.py`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from sandboxd.e2b import connect
from sandboxd.e2b.asgi import (
    Disconnected,
    Receive,
    Request,
    Scope,
    Send,
    TooLarge,
    end_stream,
    reply,
    reply_json,
    settling,
    start_stream,
    stream_chunk,
)
from sandboxd.e2b.backend import Backend
from sandboxd.e2b.connect import ConnectError
from sandboxd.e2b.envd_files import FilesystemRpcs
from sandboxd.e2b.envd_process import ProcessRpcs
from sandboxd.e2b.files_http import FilesHttp, HttpError
from sandboxd.e2b.pty import Ptys
from sandboxd.e2b.rest import Rest
from sandboxd.e2b.tokens import AccessTokens
from sandboxd.e2b.watchers import Watchers
from sandboxd.e2b.wire import session_id

log = logging.getLogger(__name__)

ENVD_PORT = 49983
MAX_MESSAGE_BYTES = 4 * 1024**2  # one Connect message (a SendInput's data, base64)

Unary = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]
Streaming = Callable[[str, str, dict[str, Any]], AsyncIterator[dict[str, Any]]]
ClientStreaming = Callable[[str, str, AsyncIterator[dict[str, Any]]], Awaitable[dict[str, Any]]]


class E2bApp:
    def __init__(
        self,
        backend: Backend,
        tokens: AccessTokens,
        *,
        domain: str,
        max_request_bytes: int,
        command_timeout_s: float,
        pty_idle_s: float,
    ) -> None:
        self._tokens = tokens
        self._max_body = max_request_bytes
        self._host = (
            re.compile(rf"\A{ENVD_PORT}-([a-z0-9][a-z0-9-]{{0,62}})\.{re.escape(domain)}(:\d+)?\Z")
            if domain
            else None
        )
        self.ptys = Ptys(backend, command_timeout_s, pty_idle_s)
        self.watchers = Watchers(backend)
        self.rest = Rest(backend, tokens, domain)
        process = ProcessRpcs(backend, self.ptys, command_timeout_s)
        fs = FilesystemRpcs(backend)
        self.files = FilesHttp(backend)
        self.unary: dict[str, Unary] = {
            "/process.Process/List": process.list,
            "/process.Process/SendInput": process.send_input,
            "/process.Process/SendSignal": process.send_signal,
            "/process.Process/CloseStdin": process.close_stdin,
            "/process.Process/Update": process.update,
            "/filesystem.Filesystem/Stat": fs.stat,
            "/filesystem.Filesystem/ListDir": fs.list_dir,
            "/filesystem.Filesystem/MakeDir": fs.make_dir,
            "/filesystem.Filesystem/Move": fs.move,
            "/filesystem.Filesystem/Remove": fs.remove,
            "/filesystem.Filesystem/CreateWatcher": self.watchers.create,
            "/filesystem.Filesystem/GetWatcherEvents": self.watchers.events,
            "/filesystem.Filesystem/RemoveWatcher": self.watchers.remove,
        }
        self.streams: dict[str, Streaming] = {
            "/process.Process/Start": process.start,
            "/process.Process/Connect": process.connect,
            "/filesystem.Filesystem/WatchDir": fs.watch_dir,
        }
        self.client_streams: dict[str, ClientStreaming] = {
            "/process.Process/StreamInput": process.stream_input,
        }

    async def close(self) -> None:
        await self.ptys.close()
        await self.watchers.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        request = Request(scope, receive, self._max_body)
        path = request.path
        envd = (
            path in self.unary
            or path in self.streams
            or path in self.client_streams
            or path.startswith(("/process.Process/", "/filesystem.Filesystem/"))
            or path == "/files"
        )
        sid = self._sandbox_of(request)
        answer = settling(request, send)
        if path == "/health":
            await self._health(request, answer, sid)
            return
        try:
            if envd:
                await self._envd(request, answer, sid)
            else:
                await self.rest.handle(request, answer)
        except TooLarge:
            # The rest of the body is never read: over HTTP/1 the connection must end with the
            # answer, or a client still sending would wait on it forever.
            close = {"connection": "close"} if request.http1 else None
            await reply_json(
                send, 413, {"code": 413, "message": "the request body is too large"}, close
            )
        except Disconnected:
            return

    async def _health(self, request: Request, send: Send, sid: str | None) -> None:
        """The REST API's health (200), or envd's: 204 while the sandbox runs, else 502, the
        status E2B's proxy answers for a sandbox that is gone (the SDK's `is_running`)."""
        if not sid:
            await reply(send, 200)
            return
        try:
            key = self._tokens.open(sid, request.header("x-access-token"))
            running = await self.rest.running(key, sid)
        except ConnectError as exc:
            await reply_json(send, exc.http_status, exc.body())
            return
        await reply(send, 204 if running else 502)

    def _sandbox_of(self, request: Request) -> str | None:
        sid = request.header("e2b-sandbox-id")
        if sid:
            return session_id(sid)
        host = (request.header("host") or "").lower()
        m = self._host.match(host) if self._host else None
        return session_id(m.group(1)) if m else None

    async def _envd(self, request: Request, send: Send, sid: str | None) -> None:
        path = request.path
        stream = path in self.streams or path in self.client_streams
        try:
            if not sid:
                raise ConnectError("not_found", "no sandbox named (E2b-Sandbox-Id)")
            key = self._tokens.open(sid, request.header("x-access-token"))
            _check_user(request.header("authorization"))
            if path == "/files":
                await self._files(key, sid, request, send)
            elif path in self.unary:
                await self._unary(self.unary[path], key, sid, request, send)
            elif path in self.streams:
                await self._stream(self.streams[path], key, sid, request, send)
            elif path in self.client_streams:
                await self._client_stream(self.client_streams[path], key, sid, request, send)
            else:
                raise ConnectError("unimplemented", f"{path} is not served by sandboxd")
        except ConnectError as exc:
            await _refuse(send, exc, stream)
        except grpc.aio.AioRpcError as exc:
            await _refuse(send, connect.from_rpc_error(exc), stream)

    async def _files(self, key: str, sid: str, request: Request, send: Send) -> None:
        try:
            if request.method == "GET":
                await self.files.read(key, sid, request, send)
            elif request.method == "POST":
                await reply_json(send, 200, await self.files.write(key, sid, request))
            else:
                raise HttpError(405, f"{request.method} /files is not allowed")
        except HttpError as exc:
            await reply_json(send, exc.status, {"code": exc.status, "message": exc.message})
        except grpc.aio.AioRpcError as exc:
            err = connect.from_rpc_error(exc)
            await reply_json(
                send, err.http_status, {"code": err.http_status, "message": err.message}
            )

    async def _unary(
        self, handler: Unary, key: str, sid: str, request: Request, send: Send
    ) -> None:
        kind = (request.header("content-type") or "").split(";")[0].strip()
        if kind != connect.UNARY_CONTENT_TYPE:
            raise ConnectError("invalid_argument", f"content-type {kind!r}: use application/json")
        message = connect.decode_json(await request.body())
        async with _deadline(request):
            answer = await handler(key, sid, message)
        await reply_json(send, 200, answer)

    async def _stream(
        self, handler: Streaming, key: str, sid: str, request: Request, send: Send
    ) -> None:
        _check_stream_type(request)
        reader = connect.JsonMessages(MAX_MESSAGE_BYTES)
        messages: list[dict[str, Any]] = []
        async for chunk in request.chunks():
            messages += reader.feed(chunk)
        reader.finish()
        if len(messages) != 1:
            raise ConnectError("invalid_argument", "a server stream takes exactly one message")
        started = False
        error: ConnectError | None = None

        async def pump() -> None:
            nonlocal started
            async with _deadline(request):
                async for item in handler(key, sid, messages[0]):
                    if not started:
                        await start_stream(send, 200, connect.STREAM_CONTENT_TYPE)
                        started = True
                    await stream_chunk(send, connect.envelope(item))

        try:
            await _until_disconnect(request, pump())
        except ConnectError as exc:
            error = exc
        except grpc.aio.AioRpcError as exc:
            error = connect.from_rpc_error(exc)
        except Disconnected:
            return
        if not started:
            await start_stream(send, 200, connect.STREAM_CONTENT_TYPE)
        await end_stream(send, connect.end_stream(error))

    async def _client_stream(
        self, handler: ClientStreaming, key: str, sid: str, request: Request, send: Send
    ) -> None:
        _check_stream_type(request)
        reader = connect.JsonMessages(MAX_MESSAGE_BYTES)

        async def messages() -> AsyncIterator[dict[str, Any]]:
            async for chunk in request.chunks():
                for m in reader.feed(chunk):
                    yield m
            reader.finish()

        error: ConnectError | None = None
        answer: dict[str, Any] = {}
        try:
            async with _deadline(request):
                answer = await handler(key, sid, messages())
        except ConnectError as exc:
            error = exc
        except grpc.aio.AioRpcError as exc:
            error = connect.from_rpc_error(exc)
        await start_stream(send, 200, connect.STREAM_CONTENT_TYPE)
        if error is None:
            await stream_chunk(send, connect.envelope(answer))
        await end_stream(send, connect.end_stream(error))


def _check_stream_type(request: Request) -> None:
    kind = (request.header("content-type") or "").split(";")[0].strip()
    if kind != connect.STREAM_CONTENT_TYPE:
        raise ConnectError(
            "invalid_argument", f"content-type {kind!r}: use application/connect+json"
        )


def _check_user(authorization: str | None) -> None:
    """envd's `Authorization: Basic <user:>` names the user to run as: only `user` is served
    (sandboxd never runs anything as root)."""
    if not authorization:
        return
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "basic":
        return
    try:
        user = base64.b64decode(value, validate=True).decode().partition(":")[0]
    except (binascii.Error, UnicodeDecodeError):
        raise ConnectError("invalid_argument", "malformed Authorization header") from None
    if user not in ("", "user"):
        raise ConnectError(
            "permission_denied", f"sandboxd runs everything as `user`, not {user[:32]!r}"
        )


@contextlib.asynccontextmanager
async def _deadline(request: Request) -> AsyncIterator[None]:
    seconds = connect.timeout_s(request.header("connect-timeout-ms"))
    if seconds is None:
        yield
        return
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise ConnectError("deadline_exceeded", "the call's connect-timeout-ms passed") from None


async def _until_disconnect(request: Request, work: Awaitable[None]) -> None:
    """Run `work` until it ends or the client goes away (then it is cancelled: a stream
    nobody reads holds nothing open on the gRPC side)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(request.wait_disconnect())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, gone):
            if not t.done():
                t.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    if task.cancelled():
        raise Disconnected
    task.result()


async def _refuse(send: Send, exc: ConnectError, stream: bool) -> None:
    if stream:
        await start_stream(send, 200, connect.STREAM_CONTENT_TYPE)
        await end_stream(send, connect.end_stream(exc))
    else:
        await reply_json(send, exc.http_status, exc.body())


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
