"""The little of ASGI the door needs: a request with bounded body reads, and replies.

The server (hypercorn) parses HTTP/1.1 and HTTP/2; this module only reads what it hands over.
A body is never read past the door's `max_request_bytes`: a Content-Length over it is refused
before any of it is read, and a body that grows past it while streaming stops there (413).

An answer that comes before the body has been read (a refusal from the headers alone) first
reads and drops the rest of a small body: an HTTP/1.1 server closes a connection whose body was
left unread, and a client still writing it then sees a broken pipe, not the answer. Past
`SETTLE_BYTES` or `SETTLE_S` the answer goes out with `Connection: close` instead."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from sandboxd.digits import decimal

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


SETTLE_BYTES = 1 << 20
SETTLE_S = 2.0


class TooLarge(Exception):
    """The body is over the door's limit."""


class Disconnected(Exception):
    """The client went away before its body ended."""


class Request:
    def __init__(self, scope: Scope, receive: Receive, max_body: int) -> None:
        self.scope = scope
        self._receive = receive
        self.max_body = max_body
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: dict[str, str] = {}
        for k, v in scope.get("headers", ()):
            self.headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        self.query: dict[str, list[str]] = urllib.parse.parse_qs(
            scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True
        )
        self._done = False
        self._gone = False

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def http1(self) -> bool:
        """Over HTTP/1 an answer with the body left unread must close the connection; HTTP/2
        resets the stream instead, and forbids the `Connection` header."""
        return bool(self.scope.get("http_version", "1.1") < "2")

    def _declares_over(self, limit: int) -> bool:
        """The request's Content-Length says its body is over `limit`."""
        length = decimal(self.header("content-length") or "")
        return length is not None and length > limit

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, never more than `max_body` bytes in all."""
        if self._declares_over(self.max_body):
            raise TooLarge
        seen = 0
        while not self._done:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise Disconnected
            body: bytes = message.get("body", b"")
            self._done = not message.get("more_body", False)
            seen += len(body)
            if seen > self.max_body:
                raise TooLarge
            if body:
                yield body

    async def settle(self, max_bytes: int = SETTLE_BYTES, seconds: float = SETTLE_S) -> bool:
        """Reads and drops what is left of the body, if at most `max_bytes` and in `seconds`:
        True when it is all read, so the connection can serve the next request."""
        if self._done:
            return True
        if self._declares_over(max_bytes):
            return False
        seen = 0
        try:
            async with asyncio.timeout(seconds):
                while not self._done:
                    message = await self._receive()
                    if message["type"] == "http.disconnect":
                        self._gone = True
                        return False
                    seen += len(message.get("body", b""))
                    self._done = not message.get("more_body", False)
                    if seen > max_bytes and not self._done:
                        return False
        except TimeoutError:
            return False
        return True

    async def wait_disconnect(self) -> None:
        """Returns when the client has gone (call once the body is read)."""
        if self._gone:
            return
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                return

    async def body(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])


def settling(request: Request, send: Send) -> Send:
    """`send`, which settles the request's body before an answer starts (the module's note)."""

    async def answer(message: Message) -> None:
        if (
            message["type"] == "http.response.start"
            and not await request.settle()
            and request.http1
        ):
            headers = [h for h in message.get("headers", ()) if h[0] != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return answer


def _headers(content_type: str | None, extra: dict[str, str] | None) -> list[tuple[bytes, bytes]]:
    out = [(b"content-type", content_type.encode())] if content_type else []
    for k, v in (extra or {}).items():
        out.append((k.lower().encode(), v.encode("latin-1")))
    return out


async def reply(
    send: Send,
    status: int,
    body: bytes = b"",
    content_type: str | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": _headers(content_type, headers),
        }
    )
    await send({"type": "http.response.body", "body": body})


async def reply_json(
    send: Send, status: int, value: Any, headers: dict[str, str] | None = None
) -> None:
    await reply(send, status, json.dumps(value).encode(), "application/json", headers)


async def start_stream(send: Send, status: int, content_type: str) -> None:
    await send(
        {"type": "http.response.start", "status": status, "headers": _headers(content_type, None)}
    )


async def stream_chunk(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def end_stream(send: Send, data: bytes = b"") -> None:
    await send({"type": "http.response.body", "body": data})
