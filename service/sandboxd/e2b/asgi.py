"""The little of ASGI the door needs: a request with bounded body reads, and replies.

The server (hypercorn) parses HTTP/1.1 and HTTP/2; this module only reads what it hands over.
A body is never read past the door's `max_request_bytes`: a Content-Length over it is refused
before any of it is read, and a body that grows past it while streaming stops there (413)."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


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

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, never more than `max_body` bytes in all."""
        length = self.header("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
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

    async def wait_disconnect(self) -> None:
        """Returns when the client has gone (call once the body is read)."""
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                return

    async def body(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])


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
