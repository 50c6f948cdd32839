"""What the egress proxy sends back on a refusal, and how it closes without losing it."""

from __future__ import annotations

import asyncio
import contextlib

CHUNK = 256 * 1024  # the proxy's read size, here too for draining
LINGER_S = 1.0
LINGER_BYTES = 256 * 1024

_STATUS_TEXT = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    502: "Bad Gateway",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}


def request_line_words(head: bytes) -> tuple[str, str]:
    """Method and target of a head that did not parse, for the audit (printable or empty)."""
    words = head[:300].split(b"\r\n", 1)[0].split(b" ")
    method = words[0].decode("ascii", "replace") if words else ""
    target = words[1].decode("ascii", "replace") if len(words) > 1 else ""
    return (
        method if method.isalpha() and method.isascii() else "",
        target if target.isprintable() else "",
    )


async def linger_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Send what was written, then read (and drop) what the client still sends for a moment
    before closing: closing a socket with unread input resets it, and the reset can destroy the
    refusal the client is about to read."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(LINGER_S):
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            left = LINGER_BYTES
            while left > 0 and (chunk := await reader.read(min(CHUNK, left))):
                left -= len(chunk)
    writer.close()


def reply(writer: asyncio.StreamWriter, status: int, reason: str, message: str) -> None:
    body = f"sandboxd egress proxy: {reason}: {message}\n".encode("ascii", "replace")
    head = (
        f"HTTP/1.1 {status} {_STATUS_TEXT.get(status, 'Error')}\r\n"
        f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        f"X-Sandboxd-Egress-Reason: {reason}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(Exception):
        writer.write(head.encode("ascii") + body)
