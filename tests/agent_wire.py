"""An independent codec of the agent channel (docs/agent.md), for tests only.

Written from the document, not from the server's service/sandboxd/agent/ package: the two
implementations check each other. The real agent as a child process, read frame by frame with
this codec: tests/agent_pipes.py (`AgentProcess`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

MAX_PAYLOAD = 65536
SYNC = b"\xff\xff\xff\xffSANDBOXDSYNC"

HELLO, HELLO_OK, PING, PONG, GOAWAY = 0x01, 0x02, 0x03, 0x04, 0x05
OPEN, OPEN_OK, DATA, EOF, WINDOW, EXIT, RESET, SIGNAL, RESIZE, CLOSE = range(0x10, 0x1A)
NAMES = {
    HELLO: "HELLO",
    HELLO_OK: "HELLO_OK",
    PING: "PING",
    PONG: "PONG",
    GOAWAY: "GOAWAY",
    OPEN: "OPEN",
    OPEN_OK: "OPEN_OK",
    DATA: "DATA",
    EOF: "EOF",
    WINDOW: "WINDOW",
    EXIT: "EXIT",
    RESET: "RESET",
    SIGNAL: "SIGNAL",
    RESIZE: "RESIZE",
    CLOSE: "CLOSE",
}


@dataclass(frozen=True)
class Frame:
    type: int
    stream: int
    payload: bytes

    def json(self) -> Any:
        return json.loads(self.payload)

    @property
    def fd(self) -> int:
        return self.payload[0]

    @property
    def data(self) -> bytes:
        return self.payload[1:]

    def __repr__(self) -> str:
        name = NAMES.get(self.type, hex(self.type))
        return f"Frame({name}, {self.stream}, {self.payload[:80]!r})"


def encode(ftype: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">IBI", len(payload), ftype, stream) + payload


def encode_json(ftype: int, stream: int, obj: object) -> bytes:
    return encode(ftype, stream, json.dumps(obj).encode())


def data(stream: int, payload: bytes, fd: int = 0) -> bytes:
    return encode(DATA, stream, bytes([fd]) + payload)


def window(stream: int, increment: int) -> bytes:
    return encode(WINDOW, stream, struct.pack(">I", increment))


class Decoder:
    """Splits the agent's byte stream into frames; a bad length is an error (the agent never
    writes one, and completes a frame it began even when an epoch ends)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, chunk: bytes) -> list[Frame]:
        self.buf += chunk
        out: list[Frame] = []
        while len(self.buf) >= 9:
            length, ftype, stream = struct.unpack(">IBI", self.buf[:9])
            if length > MAX_PAYLOAD:
                raise ValueError(f"agent wrote a frame of length {length}")
            if len(self.buf) < 9 + length:
                break
            out.append(Frame(ftype, stream, bytes(self.buf[9 : 9 + length])))
            del self.buf[: 9 + length]
        return out


def output(frames: list[Frame], fd: int = 1) -> bytes:
    return b"".join(f.data for f in frames if f.type == DATA and f.fd == fd)


def exit_of(frames: list[Frame]) -> dict[str, Any]:
    last = frames[-1]
    assert last.type == EXIT, frames
    result: dict[str, Any] = last.json()
    return result
