"""One HTTP exchange through a preview, relayed as it is: the request head (rewritten only to
drop the preview's own credentials and prefix) and body to the sandbox, its interim answers,
its answer head (plus the cookie of a query token) and body back, or, after `101 Switching
Protocols`, both directions as raw bytes until each side is done (WebSocket and any other
upgrade).

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
from collections.abc import Callable
from dataclasses import dataclass

from sandboxd.previews import http1
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
) -> Outcome:
    """Relay one request and its answer; raises SandboxSilent/SandboxGone before any byte of
    the answer reached the client (the caller answers 504/502), BadMessage/EOFError after."""

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
    try:
        answer = await _answer_head(client, backend, to_client, timeout_s)
        version, status = http1.status_of(answer)
        if set_cookie:
            answer.headers.append(("Set-Cookie", set_cookie))
        await to_client(answer.encode())
        if status == 101:
            await upload  # an upgrade request has no body; its end is the tunnel's start
            await _tunnel(client, backend, to_backend, to_client)
            return Outcome(101, keep_alive=False, upgraded=True)
        response = http1.response_framing(answer, method, status)
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
        return Outcome(status, keep_alive=keep)
    finally:
        if not upload.done():
            upload.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await upload


async def _answer_head(
    client: ClientStream, backend: ByteStream, to_client: http1.Sink, timeout_s: float
) -> Head:
    """The final answer head; interim 1xx answers (100 Continue, 103) go through as they come."""
    while True:
        try:
            async with asyncio.timeout(timeout_s):
                answer = await http1.read_head(backend)
        except TimeoutError:
            raise SandboxSilent from None
        except (EOFError, ConnectionError):
            raise SandboxGone(backend.failure() or "closed") from None
        except BadMessage:
            raise SandboxGone("malformed answer") from None
        try:
            _, status = http1.status_of(answer)
        except BadMessage:
            raise SandboxGone("malformed answer") from None
        if 100 <= status < 200 and status != 101:
            await to_client(answer.encode())
            continue
        return answer


def _close_write(stream: ByteStream) -> None:
    with contextlib.suppress(Exception):  # a stream already gone has nothing to half-close
        stream.close_write()


def _keeps_alive(request: Head, answer: Head, version: str) -> bool:
    if "close" in request.tokens("connection") or "close" in answer.tokens("connection"):
        return False
    req_version = request.start.rsplit(" ", 1)[-1]
    if req_version == "HTTP/1.0" or version == "HTTP/1.0":
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
