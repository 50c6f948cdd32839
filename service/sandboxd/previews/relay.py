"""One HTTP exchange through a preview, relayed as it is: the request head (rewritten only to
drop the preview's own credentials and prefix) and body to the sandbox, its answer head (plus
the cookie of a query token) and body back, or, after a `101 Switching Protocols` that grants
the upgrade the request asked for (`upgrade`), both directions as raw bytes until each side is
done (WebSocket and any other upgrade).

Interim answers: `100 Continue` goes through once, bare (none of its headers), when the client
sent `Expect: 100-continue` (HTTP/1.1); `103 Early Hints` is dropped (its hints come again in
the final answer, and a client then reads exactly one answer head per request, never one the
sandbox shaped to look like the start of the next); any other 1xx, a 101 that was not asked for
or does not match, ends the exchange before any of it reached the client (`SandboxBroke`: the
listener answers 502 and closes the client's connection). All of them within the answer's one
deadline: a sandbox cannot keep an exchange open with endless hints.

Backpressure: each direction is a loop that reads only after the previous write was taken
(`ClientStream.write` waits for the socket to drain; the sandbox's stream waits likewise), so
a slow client holds at most a few buffers of a response, never the response.

A reset of the sandbox's side (`BackendReset`) before the answer head is a 502 like its end;
after it, it propagates (the listener aborts the client's connection), and in a tunnel it
aborts the client's connection at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable, Coroutine
from dataclasses import dataclass

from sandboxd.previews import access, http1, upgrade
from sandboxd.previews.dialer import BackendReset, Buffered, ByteStream
from sandboxd.previews.http1 import BadMessage, Framing, Head


class ClientStream(Buffered):
    """The preview client's connection as a ByteStream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__()
        self._reader = reader
        self.writer = writer
        # A few of the relay's reads in flight to the client before a write waits (the
        # default 64 KiB would stop the relay at every one of them).
        writer.transport.set_write_buffer_limits(high=1024 * 1024)

    async def pull(self) -> bytes:
        try:
            return await self._reader.read(64 * 1024)
        except (ConnectionError, OSError):
            return b""

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def close_write(self) -> None:
        with contextlib.suppress(OSError, RuntimeError, NotImplementedError):
            if self.writer.can_write_eof():
                self.writer.write_eof()

    def failure(self) -> str:
        return ""

    def abort(self) -> None:
        """The sandbox's side was reset: the client sees a reset too (RST: a linger of 0),
        never a clean end."""
        with contextlib.suppress(OSError, RuntimeError, AttributeError):
            sock = self.writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.writer.transport.abort()


class SandboxSilent(Exception):
    """No answer head within the timeout (504)."""


class BadRequestBody(Exception):
    """The request's body was malformed (or cut) before the sandbox answered (400)."""


class SandboxBroke(Exception):
    """The sandbox answered what the relay must not pass on, before any of its answer reached
    the client (502, the client's connection closed, never retried)."""


class SandboxGone(Exception):
    """The sandbox side ended or answered garbage before its answer head (502)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass
class Outcome:
    status: int
    keep_alive: bool
    upgraded: bool = False
    backend_reusable: bool = True  # no stray bytes of the sandbox after its answer


Meter = Callable[[int, str], None]  # (bytes, direction "in" to the sandbox / "out" to client)


async def exchange(
    client: ClientStream,
    backend: ByteStream,
    head: Head,
    method: str,
    framing: Framing,
    *,
    timeout_s: float,
    set_cookie: str,
    meter: Meter,
    shared_origin: bool = False,
) -> Outcome:
    """Relay one request and its answer; raises SandboxSilent/SandboxGone/SandboxBroke before
    any byte of the answer reached the client (the caller answers 504/502), BadMessage/EOFError
    after."""

    async def to_backend(data: bytes) -> None:
        meter(len(data), "in")
        await backend.write(data)

    async def to_client(data: bytes) -> None:
        meter(len(data), "out")
        await client.write(data)

    try:
        # Within the answer's timeout too: the first write waits for the sandbox's side to be
        # open (an agent's OPEN_OK), which a sandbox that does not answer never gives.
        async with asyncio.timeout(timeout_s):
            await to_backend(head.encode())
    except TimeoutError:
        raise SandboxSilent from None
    upload = asyncio.create_task(http1.relay_body(client, to_backend, framing))
    # An upgrade request has no body: any byte the client sends before the 101 was sent on
    # is no part of the new protocol (RFC 6455 4.1, RFC 9113 3.2: the client waits for the
    # 101) but a request pipelined behind it, which a tunnel would carry to this sandbox.
    early = asyncio.create_task(client.readable()) if upgrade.requested(head) else None
    try:
        try:
            answer = await _answer_or_bad_upload(
                upload, _answer_head(head, backend, to_client, timeout_s)
            )
        finally:
            sent_early = early is not None and await _sent_early(client, early)
        version, status = answer.version, answer.status
        if status == 101 and not upgrade.granted(head, answer):
            raise SandboxBroke("a 101 the request did not ask for")
        if status == 101 and sent_early:
            raise BadRequestBody(
                "bytes were sent after the upgrade request before its 101 (a pipelined "
                "request is never carried into an upgraded connection)"
            )
        try:
            stray = _drop_body_headers(answer)
            response = http1.response_framing(answer, method, status)
        except BadMessage as exc:
            raise SandboxBroke(str(exc)) from None
        _drop_origin_headers(answer, shared_origin)
        if set_cookie:
            answer.headers.append(("Set-Cookie", set_cookie))
        await to_client(answer.encode())
        if status == 101:
            await upload  # an upgrade request has no body; its end is the tunnel's start
            await _tunnel(client, backend, to_backend, to_client)
            return Outcome(101, keep_alive=False, upgraded=True)
        if response == http1.UNTIL_CLOSE:
            # The answer ends when the sandbox closes; an exec of `sbx dial` carries that only
            # once it exits, which it does when its stdin ends too (a `dial` stream of the
            # agent ends when both directions are done). The
            # connection cannot be reused anyway: end the request side once it is sent
            # (without waiting for it here: a sandbox may answer before reading a body).
            upload.add_done_callback(lambda _: _close_write(backend))
        await http1.relay_body(backend, to_client, response)
        if not upload.done():
            # The sandbox answered before reading the whole request body: the connection's
            # framing is unknowable now, so it ends with this answer.
            return Outcome(status, keep_alive=False)
        await upload
        keep = response != http1.UNTIL_CLOSE and _keeps_alive(head, answer, version)
        reusable = not stray and backend.buffered() == 0
        return Outcome(status, keep_alive=keep, backend_reusable=reusable)
    finally:
        if not upload.done():
            upload.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await upload


async def _sent_early(client: ClientStream, early: asyncio.Task[bool]) -> bool:
    """Whether the client sent anything after its upgrade request. The watch is ended (and
    awaited, so no read of it is left waiting on the client); a byte it read stays in the
    client's buffer for whatever reads next."""
    if not early.done():
        early.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await early
    done = early.done() and not early.cancelled() and early.exception() is None
    return client.buffered() > 0 or (done and early.result())


MAX_INTERIM = 16
# The one interim answer a client is sent, as the listener writes it: the headers of a
# sandbox's 100 would pass every filter of the final answer (the listener's own cookie, the
# origin-wide headers) and a lenient client might read a body by its Content-Length.
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


async def _answer_or_bad_upload(
    upload: asyncio.Task[None], answer: Coroutine[None, None, Head]
) -> Head:
    """The answer head, unless the request's body turns out malformed (or the client ends
    inside it) first: then BadMessage at once, the client's 400, not a wait for a sandbox
    that may be waiting for the rest of the body."""
    waiting = asyncio.create_task(answer)
    try:
        await asyncio.wait({waiting, upload}, return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done() and upload.exception() is not None:
            raise BadRequestBody(str(upload.exception()) or "the client ended inside its body")
        return await waiting
    finally:
        if not waiting.done():
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await waiting


async def _answer_head(
    request: Head, backend: ByteStream, to_client: http1.Sink, timeout_s: float
) -> Head:
    """The final answer head (or a 101); interim answers as the module says."""
    expects = request.version == "HTTP/1.1" and "100-continue" in request.tokens("expect")
    continued = False
    try:
        async with asyncio.timeout(timeout_s):
            for _ in range(MAX_INTERIM):
                answer = await http1.read_response(backend)
                status = answer.status
                if status >= 200 or status == 101:
                    return answer
                if status == 100 and not expects:
                    raise SandboxBroke("100 Continue to a request that expected none")
                if status == 100 and not continued:  # once: a second one is not news
                    continued = True
                    await to_client(CONTINUE)  # bare: none of the sandbox's headers
                elif status not in (100, 103):
                    raise SandboxBroke(f"an unexpected interim answer {status}")
    except TimeoutError:
        raise SandboxSilent from None
    except (EOFError, ConnectionError):
        raise SandboxGone(backend.failure() or "closed") from None
    except BadMessage:
        raise SandboxBroke("a malformed answer head") from None
    raise SandboxBroke("too many interim answers")


def _drop_body_headers(answer: Head) -> bool:
    """Transfer-Encoding, and on a 204 Content-Length, are removed from answers that have no
    body (RFC 9110 sections 8.6 and 6.1: a server must not send them there): a lenient client
    would read the start of its next answer as this one's body. Whether one declared a body
    (the sandbox may then send bytes that answer nothing: its connection is not reused)."""
    if answer.status not in (204, 304):
        return False
    declared = http1.declares_body(answer) if answer.status == 204 else False
    declared = declared or answer.get("transfer-encoding") is not None
    answer.remove("transfer-encoding")
    if answer.status == 204:
        answer.remove("content-length")
    return declared


# What an answer of one path-routed preview could set for every other on their one origin:
# a service worker's scope widened to `/` (it would see every preview's requests, a link's
# `sandboxd_token` among them), a Network Error Logging policy (reports of every request's URL,
# tokens included, to the sandbox's endpoint), the origin's cookies cleared, its traffic sent
# to an alternative service, HSTS for the listener's host and its subdomains.
_ORIGIN_WIDE = (
    "service-worker-allowed",
    "nel",
    "report-to",
    "clear-site-data",
    "alt-svc",
    "strict-transport-security",
)


def _drop_origin_headers(answer: Head, shared_origin: bool) -> None:
    """A sandbox never sets the listener's own cookie: on the shared origin of path-routed
    previews (or a `Domain=` of the preview domain) it would replace another preview's token
    in the visitor's browser. On the shared origin, it sets nothing origin-wide either."""
    answer.headers = [
        (k, v)
        for k, v in answer.headers
        if not (k.lower() == "set-cookie" and v.partition("=")[0].strip(" \t") == access.COOKIE)
        and not (shared_origin and k.lower() in _ORIGIN_WIDE)
    ]


def _close_write(stream: ByteStream) -> None:
    with contextlib.suppress(Exception):  # a stream already gone has nothing to half-close
        stream.close_write()


def _keeps_alive(request: Head, answer: Head, version: str) -> bool:
    if "close" in request.tokens("connection") or "close" in answer.tokens("connection"):
        return False
    if request.version == "HTTP/1.0" or version == "HTTP/1.0":
        return "keep-alive" in request.tokens("connection") and "keep-alive" in answer.tokens(
            "connection"
        )
    return True


async def _tunnel(
    client: ClientStream,
    backend: ByteStream,
    to_backend: http1.Sink,
    to_client: http1.Sink,
) -> None:
    """Raw bytes both ways after an upgrade, each direction half-closed on its own."""

    async def pump(source: ByteStream, sink: http1.Sink, done: Callable[[], None]) -> None:
        try:
            while data := await source.read_some():
                await sink(data)
        except BackendReset:
            client.abort()
            return
        except (ConnectionError, OSError):
            pass
        done()

    async with asyncio.TaskGroup() as tg:
        tg.create_task(pump(client, to_backend, backend.close_write))
        tg.create_task(pump(backend, to_client, client.close_write))
