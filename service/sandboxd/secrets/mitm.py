"""The intercepting relay of a CONNECT to a host a secret is bound to.

The proxy has dialled the checked address; here the upstream side is secured first (its
certificate verified against the system roots plus `egress_upstream_ca_file`, ALPN http/1.1)
so a failure is still a plain refusal of the CONNECT. Then the sandbox's side is terminated
with a leaf of the session's CA, and HTTP/1.1 messages are relayed one by one (keep-alive),
each request head rewritten with the secrets of that moment: a rotation reaches the next
request on an open connection, a request in flight keeps what it was sent with. Bodies are
streamed in chunks, never held whole.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandboxd.digits import decimal
from sandboxd.models import SecretBinding
from sandboxd.secrets.inject import (
    Head,
    HeadError,
    HostMismatch,
    body_framing,
    check_host,
    content_length,
    inject,
    parse_head,
)
from sandboxd.secrets.vault import SecretUnavailable
from sandboxd.targets import MAX_HEAD_BYTES

if TYPE_CHECKING:
    from sandboxd.secrets.ca import SessionCA

CHUNK = 256 * 1024
# The limit of the sandbox side's reader once its TLS is terminated. asyncio decrypts all that
# one read of the connection brings (up to 256 KiB of records) in one go, and a StreamReader
# pauses its transport above twice its limit: with the plain side's 16 KiB every chunk of an
# upload paused and resumed the connection (two epoll calls and a loop pass each, the sender
# stalled meanwhile). A head or chunk line from the sandbox over MAX_HEAD_BYTES is still cut
# (`_head`, `_line`); one that never ends is buffered up to this limit or the idle timeout.
TLS_READ_LIMIT = CHUNK // 2
# The proxy's budgeted write: (writer, data, direction, per-connection counts).
Send = Callable[[asyncio.StreamWriter, bytes, str, dict[str, int]], Awaitable[None]]


class Refusal(Exception):
    """A request the proxy refuses before relaying (upstream TLS not verified, a misdirected
    placeholder under refuse_misdirected_secrets): one HTTP reply with this status."""

    def __init__(self, reason: str, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class Secrets:
    """What one request is rewritten with (the proxy's live view)."""

    bindings: Sequence[SecretBinding]
    refuse_misdirected: bool
    value_of: Callable[[SecretBinding], bytes]


# Audit hook: (kind, method, secret name) per injection or misdirection.
Record = Callable[[str, str, str], None]


async def secure_upstream(
    writer: asyncio.StreamWriter, host: str, ctx: ssl.SSLContext, timeout_s: float
) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            await writer.start_tls(ctx, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        raise Refusal(
            "UPSTREAM_CERT_INVALID",
            f"the certificate of {host} does not verify: {exc.verify_message}",
        ) from None
    except (ssl.SSLError, TimeoutError, ConnectionError, OSError) as exc:
        raise Refusal(
            "UPSTREAM_TLS_FAILED", f"TLS with {host} failed: {type(exc).__name__}"
        ) from None


async def _head(r: asyncio.StreamReader, timeout_s: float, most: int | None) -> bytes | None:
    """One head (at most `most` bytes, else the reader's limit), or None when the peer closed
    cleanly between messages."""
    async with asyncio.timeout(timeout_s):
        try:
            raw = await r.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise HeadError("connection closed mid-head") from None
            return None
        except asyncio.LimitOverrunError:
            raise HeadError("head too large") from None
    if most is not None and len(raw) > most:
        raise HeadError("head too large")
    return raw


async def _line(r: asyncio.StreamReader, timeout_s: float, most: int | None) -> bytes:
    """One line of a chunked body (size or trailer), bounded as heads are."""
    async with asyncio.timeout(timeout_s):
        try:
            line = await r.readuntil(b"\r\n")
        except asyncio.LimitOverrunError:
            raise HeadError("chunk line too long") from None
    if most is not None and len(line) > most:
        raise HeadError("chunk line too long")
    return line


def _error(status: int, reason: str, message: str) -> bytes:
    body = f"sandboxd egress proxy: {reason}: {message}\n".encode("ascii", "replace")
    return (
        f"HTTP/1.1 {status} Error\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nX-Sandboxd-Egress-Reason: {reason}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


class HttpRelay:
    def __init__(
        self,
        host: str,
        secrets: Callable[[], Secrets],
        record: Record,
        send: Send,
        idle_timeout_s: float,
    ) -> None:
        self.host = host
        self._secrets = secrets
        self._record = record
        self._budgeted = send
        self._idle = idle_timeout_s
        self._counts = {"up": 0, "down": 0}

    def bind_counts(self, counts: dict[str, int]) -> None:
        """The connection's byte counts (the proxy's audit reports them at the end)."""
        self._counts = counts

    async def _send(self, w: asyncio.StreamWriter, data: bytes, way: str) -> None:
        await self._budgeted(w, data, way, self._counts)

    async def terminate(
        self, writer: asyncio.StreamWriter, ca: SessionCA, timeout_s: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The sandbox's side over TLS with a leaf of the session CA: a reader (its limit
        `TLS_READ_LIMIT`) and writer of its own; the caller closes that writer. (The plain
        ones are not read again: the sandbox sends nothing before the CONNECT's answer.)"""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(TLS_READ_LIMIT, loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        async with asyncio.timeout(timeout_s):
            await writer.drain()
            transport = await loop.start_tls(
                writer.transport, protocol, ca.context(self.host), server_side=True
            )
        if transport is None:
            raise ConnectionResetError("the sandbox closed during the TLS handshake")
        protocol.connection_made(transport)  # start_tls does not call it: flow control needs it
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def run(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
    ) -> None:
        """Relay requests until either side closes or a message says so."""
        while True:
            raw = await _head(client_r, self._idle, MAX_HEAD_BYTES)
            if raw is None:
                return
            try:
                req = parse_head(raw)
                length = body_framing(req)
                check_host(req, self.host)
                method = req.start.split(" ", 1)[0]
                now = self._secrets()
                out = inject(req, self.host, now.bindings, now.value_of)
            except HeadError as exc:
                client_w.write(_error(400, "MALFORMED_REQUEST", str(exc)))
                return
            except HostMismatch as exc:
                client_w.write(_error(421, "HOST_MISMATCH", str(exc)))
                return
            except SecretUnavailable:
                # (the value is not named; only that it cannot be had)
                client_w.write(
                    _error(
                        502,
                        "SECRET_UNAVAILABLE",
                        "a secret bound to this host "
                        "cannot be read; set it again with UpdateNetworkPolicy",
                    )
                )
                return
            for name in out.misdirected:
                self._record("secret_misdirected", method, name)
            if out.misdirected and now.refuse_misdirected:
                client_w.write(
                    _error(
                        403,
                        "SECRET_MISDIRECTED",
                        "a secret's placeholder is "
                        f"not for {self.host}: " + ",".join(out.misdirected),
                    )
                )
                return
            for name in out.injected:
                self._record("secret_injected", method, name)
            if any("100-continue" in v.lower() for v in out.head.get("expect")):
                # Answered here: the upstream never sees the Expect, so sends no 100 itself.
                out.head.fields = [(k, v) for k, v in out.head.fields if k.lower() != "expect"]
                await self._send(client_w, b"HTTP/1.1 100 Continue\r\n\r\n", "down")
            await self._send(up_w, out.head.encode(), "up")
            await self._body(client_r, up_w, length, "up")
            if not await self._response(method, req, up_r, client_w, client_r, up_w):
                return

    async def _response(
        self,
        method: str,
        req: Head,
        up_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        client_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
    ) -> bool:
        """Relay one response; whether the connection carries another request."""
        while True:
            raw = await _head(up_r, self._idle, None)
            if raw is None:
                return False
            resp = parse_head(raw)
            parts = resp.start.split(" ", 2)
            status = decimal(parts[1], max_digits=3) if len(parts) >= 2 else None
            if status is None:
                raise HeadError("bad status line")
            await self._send(client_w, raw, "down")
            if status == 101:
                await self._tunnel(client_r, client_w, up_r, up_w)
                return False
            if 100 <= status < 200:
                continue
            break
        closing = any("close" in v.lower() for v in resp.get("connection") + req.get("connection"))
        if method == "HEAD" or status in (204, 304):
            return not closing
        te = resp.get("transfer-encoding")
        if te and te[-1].strip().lower().endswith("chunked"):
            await self._body(up_r, client_w, None, "down")
        elif resp.get("content-length") and not te:
            await self._body(up_r, client_w, content_length(resp), "down")
        else:
            await self._body(up_r, client_w, -1, "down")  # until the upstream closes
            return False
        return not closing

    async def _body(
        self, r: asyncio.StreamReader, w: asyncio.StreamWriter, length: int | None, way: str
    ) -> None:
        """Copy a body: `length` bytes, chunked (None), or to the end (-1)."""
        if length is None:
            await self._chunked(r, w, way)
            return
        while length != 0:
            async with asyncio.timeout(self._idle):
                chunk = await r.read(CHUNK if length < 0 else min(CHUNK, length))
            if not chunk:
                if length > 0:
                    raise ConnectionError("body cut short")
                return
            if length > 0:
                length -= len(chunk)
            await self._send(w, chunk, way)

    async def _chunked(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, way: str) -> None:
        most = MAX_HEAD_BYTES if way == "up" else None  # the sandbox's lines, as its heads
        while True:
            line = await _line(r, self._idle, most)
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HeadError("bad chunk size") from None
            if size < 0 or len(size_text) > 16:
                raise HeadError("bad chunk size")
            await self._send(w, line, way)
            if size == 0:
                while True:  # trailers, up to the empty line
                    trailer = await _line(r, self._idle, most)
                    await self._send(w, trailer, way)
                    if trailer == b"\r\n":
                        return
            await self._body(r, w, size + 2, way)

    async def _tunnel(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
    ) -> None:
        """After a 101 (protocol switch): bytes both ways, no more rewriting."""

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter, way: str) -> None:
            await self._body(r, w, -1, way)

        tasks = [
            asyncio.create_task(pump(client_r, up_w, "up")),
            asyncio.create_task(pump(up_r, client_w, "down")),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["MAX_HEAD_BYTES", "HttpRelay", "Secrets", "Refusal", "secure_upstream"]
