"""The engine's multiplexed stdio (`Tty: false`: an 8-byte header, then the bytes of one
write to stdout or stderr) split into messages with one copy of each byte.

aiodocker's own parser appends what the socket gave to a buffer, copies each message out of
it twice (a slice of the bytearray, then `bytes` of that) and then deletes the message from
the buffer's front, which moves everything after it: one 256 KiB read of 32 KiB messages
moved its bytes about four times over. The agent channel moves every archive byte through
here, so this parser takes each message straight out of what the socket gave (one slice),
keeps only an incomplete message's start for the next read, and hands aiodocker's queue
the same `Message`s. Nothing here touches a socket (sandboxd.engine.compat installs it).
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

from aiodocker.stream import Message

HEADER = struct.Struct(">BxxxL")  # stream (0 stdin, 1 stdout, 2 stderr), then the length


class MessageQueue(Protocol):
    def feed_data(self, data: Any, size: int) -> None: ...

    def feed_eof(self) -> None: ...

    def set_exception(self, exc: BaseException) -> None: ...


class Demux:
    """What aiohttp's protocol calls with each read of the hijacked connection (its payload
    parser: `feed_data`, `feed_eof`, `set_exception`), as aiodocker's parser is."""

    def __init__(self, queue: MessageQueue, pending: bytes = b"") -> None:
        self.queue = queue
        self._pending = pending  # the start of a message the next read completes

    def set_exception(self, exc: BaseException) -> None:
        self.queue.set_exception(exc)

    def feed_eof(self) -> None:
        self.queue.feed_eof()

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        at = self._complete(data) if self._pending else 0
        end_of_data = len(data)
        if at < 0:
            return False, b""
        queue = self.queue
        while end_of_data - at >= HEADER.size:
            fileno, size = HEADER.unpack_from(data, at)
            end = at + HEADER.size + size
            if end > end_of_data:
                break
            queue.feed_data(Message(fileno, data[at + HEADER.size : end]), size)
            at = end
        if at < end_of_data:
            self._pending = data[at:] if at else data
        return False, b""  # (error, tail): never an error, as aiodocker's

    def _complete(self, data: bytes) -> int:
        """The message begun in an earlier read, finished from `data` if it holds the rest;
        where the next message begins in `data` (-1: all of it went to the pending one)."""
        pending = self._pending
        skip = max(0, HEADER.size - len(pending))  # header bytes still to come
        head = pending + data[:skip] if skip else pending
        if len(head) < HEADER.size:
            self._pending = head
            return -1
        fileno, size = HEADER.unpack_from(head, 0)
        size = int(size)
        need = HEADER.size + size - len(head)  # body bytes of `data` after the header's
        if skip + need > len(data):
            self._pending = pending + data
            return -1
        self._pending = b""
        with memoryview(head) as start, memoryview(data) as rest:
            body = b"".join((start[HEADER.size :], rest[skip : skip + need]))
        self.queue.feed_data(Message(fileno, body), size)
        return skip + need
