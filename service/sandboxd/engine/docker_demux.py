"""The engine's multiplexed stdio (`Tty: false`: an 8-byte header, then the bytes of one
write to stdout or stderr) split into messages with one copy of each byte.

aiodocker's own parser appends what the socket gave to a buffer, copies each message out of
it twice (a slice of the bytearray, then `bytes` of that) and then deletes the message from
the buffer's front, which moves everything after it: one 256 KiB read of 32 KiB messages
moved its bytes about four times over. The agent channel moves every archive byte through
here, so this parser takes each message straight out of what the socket gave (one slice),
keeps only an incomplete message's start for the next read (grown in place, so a message
in many small reads costs its size, not its size times the reads), and hands aiodocker's
queue the same `Message`s. Nothing here touches a socket (sandboxd.engine.compat installs it).

What it does not take from the engine, where aiodocker's parser takes anything: a header
that claims more than MAX_MESSAGE (that parser would buffer up to 4 GiB waiting for it), a
stream id the framing has no use for, the engine's own error stream (Docker's `systemerr`),
and a stream cut inside a message. Each ends the pipe with a `DemuxError` that says which,
as Docker's own client (stdcopy) refuses them; the channel's reader sees that as the pipe's
end and logs it.
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

from aiodocker.stream import Message

HEADER = struct.Struct(">BxxxL")  # stream (0 stdin, 1 stdout, 2 stderr), then the length
# dockerd writes one message per 32 KiB read of a container's output: 32 times that is
# past any engine's message and still a bound on what one attachment holds.
MAX_MESSAGE = 1024 * 1024
STREAMS = (0, 1, 2)  # what aiodocker passes on (stdin's, where an engine echoes it, too)
SYSTEMERR = 3  # the engine's own error text, in Docker's framing
ERROR_TEXT = 512  # of the engine's error text, in the refusal


class DemuxError(ConnectionError):
    """The engine's attach stream broke its framing: the pipe ends here."""


class MessageQueue(Protocol):
    def feed_data(self, data: Any, size: int) -> None: ...

    def feed_eof(self) -> None: ...

    def set_exception(self, exc: BaseException) -> None: ...


class Demux:
    """What aiohttp's protocol calls with each read of the hijacked connection (its payload
    parser: `feed_data`, `feed_eof`, `set_exception`), as aiodocker's parser is."""

    def __init__(self, queue: MessageQueue, pending: bytes = b"") -> None:
        self.queue = queue
        self._pending = bytearray()  # the start of a message the next read completes
        self._failed = False
        if pending:
            self.feed_data(pending)

    @property
    def buffered(self) -> int:
        """Bytes held of a message begun (at most HEADER.size + MAX_MESSAGE)."""
        return len(self._pending)

    def set_exception(self, exc: BaseException) -> None:
        self.queue.set_exception(exc)

    def feed_eof(self) -> None:
        if self._failed:
            return
        if self._pending:
            self._fail(self._cut_short())
        else:
            self.queue.feed_eof()

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        """(error, tail) as aiohttp wants of a payload parser: an error makes it drop this
        parser and what the connection still sends; the tail is never anything."""
        if self._failed:
            return True, b""
        at = self._complete(data) if self._pending else 0
        end_of_data = len(data)
        queue = self.queue
        while at >= 0 and end_of_data - at >= HEADER.size:
            fileno, size = HEADER.unpack_from(data, at)
            end = at + HEADER.size + size
            if size > MAX_MESSAGE or fileno not in STREAMS:
                if self._refused(fileno, size) or end > end_of_data:
                    break
                self._deliver(fileno, data[at + HEADER.size : end], size)
                break  # the engine's error: nothing after it is taken
            if end > end_of_data:
                break
            queue.feed_data(Message(fileno, data[at + HEADER.size : end]), size)
            at = end
        if not self._failed and 0 <= at < end_of_data:
            with memoryview(data) as rest:
                self._pending = bytearray(rest[at:])
        return self._failed, b""

    def _complete(self, data: bytes) -> int:
        """The message begun in an earlier read, finished from `data` if it holds the rest;
        where the next message begins in `data` (-1: all of it went to the pending one, or
        the message was refused)."""
        pending = self._pending
        skip = max(0, HEADER.size - len(pending))  # header bytes still to come
        with memoryview(data) as rest:
            if skip:
                pending += rest[:skip]
                if len(pending) < HEADER.size:
                    return -1
            fileno, size = HEADER.unpack_from(pending, 0)
            if self._refused(fileno, size):
                return -1
            need = HEADER.size + size - len(pending)  # body bytes of `data` after the header
            if skip + need > len(data):
                pending += rest[skip:]
                return -1
            pending += rest[skip : skip + need]
        with memoryview(pending) as whole:
            body = bytes(whole[HEADER.size :])
        self._pending = bytearray()
        self._deliver(fileno, body, size)
        return -1 if self._failed else skip + need

    def _refused(self, fileno: int, size: int) -> bool:
        """Refuse, as soon as its header is in, a message no engine sends."""
        if size > MAX_MESSAGE:
            self._fail(f"a message of {size} bytes on stream {fileno} (at most {MAX_MESSAGE})")
        elif fileno not in STREAMS and fileno != SYSTEMERR:
            self._fail(f"a message on stream {fileno} (0 to 3 have a use)")
        return self._failed

    def _deliver(self, fileno: int, body: bytes, size: int) -> None:
        if fileno == SYSTEMERR:
            text = body[:ERROR_TEXT].decode(errors="replace").strip()
            self._fail(f"the engine's error stream: {text}")
        else:
            self.queue.feed_data(Message(fileno, body), size)

    def _cut_short(self) -> str:
        held = len(self._pending)
        if held < HEADER.size:
            return f"the stream ended inside a message's header ({held} of {HEADER.size} bytes)"
        _, size = HEADER.unpack_from(self._pending, 0)
        got = held - HEADER.size
        return f"the stream ended inside a message ({got} of its {size} bytes)"

    def _fail(self, why: str) -> None:
        self._failed = True
        self._pending = bytearray()
        self.queue.set_exception(DemuxError(f"the engine's attach stream broke its framing: {why}"))
