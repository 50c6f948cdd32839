"""The agent channel's frames (docs/agent.md, protocol v1): encoding, and a decoder that never
holds more than one frame plus one transport chunk.

The decoder has two modes. Strict: frames follow each other; a length over MAX_PAYLOAD cannot
be parsed and ends the epoch (`FrameError`). Scanning (after SYNC + HELLO, until the agent's
HELLO_OK with our nonce): everything before that HELLO_OK is noise from an earlier epoch, so
every offset that could start a HELLO_OK header is tried on its own, and a half-written frame
of the old epoch can never swallow the answer.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

VERSION = 1
MAX_PAYLOAD = 65536
DEFAULT_WINDOW = 262144
HEADER = struct.Struct(">IBI")  # length, type, stream
SYNC = b"\xff\xff\xff\xff" + b"SANDBOXDSYNC"
MAX_STREAM_ID = 2**32 - 1
MAX_WINDOW = 2**31 - 1  # a window grown past this is the peer's bug: RESET FLOW_CONTROL
_U32 = struct.Struct(">I")
_RESIZE = struct.Struct(">HH")
_FD = [bytes([fd]) for fd in range(256)]


class FrameType(IntEnum):
    HELLO = 0x01
    HELLO_OK = 0x02
    PING = 0x03
    PONG = 0x04
    GOAWAY = 0x05
    OPEN = 0x10
    OPEN_OK = 0x11
    DATA = 0x12
    EOF = 0x13
    WINDOW = 0x14
    EXIT = 0x15
    RESET = 0x16
    SIGNAL = 0x17
    RESIZE = 0x18
    CLOSE = 0x19


KNOWN_TYPES = frozenset(int(t) for t in FrameType)


class FrameError(Exception):
    """Input that cannot be parsed as frames at all: the epoch ends."""


class StreamError(Exception):
    """A frame that parses but breaks the rules of its stream: RESET that stream only.

    `code` is the RESET's error name (PROTOCOL or FLOW_CONTROL)."""

    def __init__(self, message: str, code: str = "PROTOCOL") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Frame:
    type: int
    stream: int
    payload: bytes


def encode(ftype: int, stream: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"frame payload of {len(payload)} bytes over {MAX_PAYLOAD}")
    return HEADER.pack(len(payload), ftype, stream) + payload


def encode_json(ftype: int, stream: int, doc: dict[str, Any]) -> bytes:
    return encode(ftype, stream, json.dumps(doc, separators=(",", ":")).encode())


def data(stream: int, fd: int, chunk: bytes | memoryview) -> bytes:
    """One DATA frame, its bytes copied once (`chunk` may be a view into a larger buffer)."""
    if len(chunk) + 1 > MAX_PAYLOAD:
        raise ValueError(f"frame payload of {len(chunk) + 1} bytes over {MAX_PAYLOAD}")
    return b"".join((HEADER.pack(len(chunk) + 1, FrameType.DATA, stream), _FD[fd], chunk))


def data_run(stream: int, fd: int, view: memoryview) -> bytes:
    """All of `view` as DATA frames of at most MAX_PAYLOAD, in one buffer: each byte copied
    once however many frames it makes (one frame each would be copied again where the
    writer joins its batch), and one send for the lot."""
    step = MAX_PAYLOAD - 1
    if len(view) <= step:
        return data(stream, fd, view)
    parts: list[bytes | memoryview] = []
    for at in range(0, len(view), step):
        piece = view[at : at + step]
        parts += (HEADER.pack(len(piece) + 1, FrameType.DATA, stream), _FD[fd], piece)
    return b"".join(parts)


def eof(stream: int, fd: int) -> bytes:
    return encode(FrameType.EOF, stream, bytes([fd]))


def window(stream: int, increment: int) -> bytes:
    return encode(FrameType.WINDOW, stream, _U32.pack(increment))


def reset(stream: int, error: str, message: str = "") -> bytes:
    return encode_json(FrameType.RESET, stream, {"error": error, "message": message[:500]})


def signal(stream: int, signo: int) -> bytes:
    return encode(FrameType.SIGNAL, stream, bytes([signo]))


def resize(stream: int, rows: int, cols: int) -> bytes:
    return encode(FrameType.RESIZE, stream, _RESIZE.pack(rows, cols))


def parse_json(frame: Frame) -> dict[str, Any]:
    """The payload as a JSON object; StreamError otherwise (the caller decides how far the
    damage goes: the epoch on stream 0, the stream elsewhere)."""
    try:
        doc = json.loads(frame.payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise StreamError(f"{FrameType(frame.type).name}: payload is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise StreamError(f"{FrameType(frame.type).name}: payload is not a JSON object")
    return doc


def parse_u32(frame: Frame) -> int:
    if len(frame.payload) != 4:
        raise StreamError(f"{FrameType(frame.type).name}: payload of {len(frame.payload)} bytes")
    return int(_U32.unpack(frame.payload)[0])


def parse_fd(frame: Frame) -> int:
    if len(frame.payload) < 1:
        raise StreamError(f"{FrameType(frame.type).name}: no fd byte")
    return frame.payload[0]


# The bytes of a HELLO_OK header after its length: type 0x02, stream 0.
_HELLO_OK_TAIL = bytes([FrameType.HELLO_OK]) + b"\x00\x00\x00\x00"


class FrameDecoder:
    """Incremental decoder over the agent's byte stream; see the module's docstring."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._at = 0  # strict mode: where the next frame begins (compacted on feed)
        self._scanning_for: str | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._at

    def scan_for(self, nonce: str) -> None:
        """Discard everything until a HELLO_OK carrying `nonce` (a new epoch began)."""
        self._compact()
        self._scanning_for = nonce

    def _compact(self) -> None:
        if self._at:
            del self._buf[: self._at]
            self._at = 0

    @property
    def scanning(self) -> bool:
        return self._scanning_for is not None

    def feed(self, chunk: bytes) -> None:
        self._compact()
        self._buf += chunk

    def next(self) -> Frame | None:
        """The next complete frame, None when more input is needed.

        Scanning, it returns only the HELLO_OK that ends the scan (then strict mode resumes).
        """
        if self._scanning_for is not None:
            return self._scan()
        at = self._at
        if len(self._buf) - at < HEADER.size:
            return None
        length, ftype, stream = HEADER.unpack_from(self._buf, at)
        if length > MAX_PAYLOAD:
            self._buf.clear()
            self._at = 0
            raise FrameError(f"frame length {length} over {MAX_PAYLOAD}")
        end = at + HEADER.size + length
        if len(self._buf) < end:
            return None
        with memoryview(self._buf) as view:  # one copy of the payload, not two
            frame = Frame(ftype, stream, bytes(view[at + HEADER.size : end]))
        self._at = end
        return frame

    def _scan(self) -> Frame | None:
        nonce = self._scanning_for
        start = 0
        while True:
            at = self._buf.find(_HELLO_OK_TAIL, start + 4)
            if at < 0:
                # Keep only what could still begin a header (its length and part of the tail).
                keep = HEADER.size - 1
                if len(self._buf) > keep:
                    del self._buf[: len(self._buf) - keep]
                return None
            head = at - 4
            (length,) = _U32.unpack_from(self._buf, head)
            if length > MAX_PAYLOAD:
                start = head + 1
                continue
            end = head + HEADER.size + length
            if len(self._buf) < end:
                del self._buf[:head]  # wait for the rest of this candidate
                return None
            frame = Frame(FrameType.HELLO_OK, 0, bytes(self._buf[head + HEADER.size : end]))
            if _carries_nonce(frame, nonce):
                del self._buf[:end]
                self._scanning_for = None
                return frame
            start = head + 1


def _carries_nonce(frame: Frame, nonce: str | None) -> bool:
    try:
        doc = parse_json(frame)
    except StreamError:
        return False
    return doc.get("nonce") == nonce
