"""The engine's multiplexed stdio framing for the demuxer's tests (test_docker_demux*.py): the
wire form of messages, and the queue a parser feeds, which refuses a message after the end."""

from __future__ import annotations

import struct
from typing import Any

HEADER = struct.Struct(">BxxxL")  # stream id, three zero bytes, big-endian length


class Queue:
    """What aiodocker's stream queue is to a parser: messages, EOF, an error."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, bytes, int]] = []
        self.eof = False
        self.error: BaseException | None = None

    def feed_data(self, data: Any, size: int) -> None:
        assert self.error is None and not self.eof, "a message after the end"
        self.messages.append((data.stream, data.data, size))

    def feed_eof(self) -> None:
        self.eof = True

    def set_exception(self, exc: BaseException) -> None:
        self.error = exc


def header(fd: int, size: int) -> bytes:
    return HEADER.pack(fd, size)


def wire(messages: list[tuple[int, bytes]]) -> bytes:
    return b"".join(header(fd, len(data)) + data for fd, data in messages)
