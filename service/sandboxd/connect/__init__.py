"""The wire framing of the Connect protocol (v1) and of gRPC-Web: pure, no I/O.

Both protocols carry protobuf messages (binary or JSON) over plain HTTP/1.1 requests, which is
what a browser's `fetch` can make; the web gateway (`sandboxd.web`) translates them to gRPC.

- An envelope (Connect streams, every gRPC-Web body) is a flags byte, a 4-byte big-endian
  length and the message. `EnvelopeReader` takes bytes as they arrive and yields whole
  envelopes, refusing one longer than its cap before buffering it.
- A Connect error is `{"code", "message", "details"}` with the code in snake case; unary calls
  send it as the body with the HTTP status of the protocol's table, streams in their last
  envelope (flag 0x02) as `{"error": {...}, "metadata": {...}}`.
- gRPC-Web ends its body with a trailers envelope (flag 0x80) holding HTTP/1-style header lines
  (`grpc-status: 0`).

Only the framing is here, so every malformed input is a unit test and any other HTTP door that
speaks Connect can share it.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import status_pb2

FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02  # Connect: the last envelope of a server stream
FLAG_TRAILERS = 0x80  # gRPC-Web: the trailers envelope
HEADER = struct.Struct(">BI")

# Connect's codes are gRPC's in snake case; a unary error's HTTP status is the protocol's table.
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}


class FramingError(ValueError):
    """A body that is not a sequence of well-formed envelopes within the cap. `code` is the
    Connect code (snake case) a door answers it with."""

    def __init__(self, message: str, code: str = "invalid_argument") -> None:
        super().__init__(message)
        self.code = code


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return HEADER.pack(flags, len(payload)) + payload


@dataclass
class EnvelopeReader:
    """Whole envelopes out of bytes fed in any pieces; none longer than `max_message_bytes`.

    `flags` are the flags an envelope may carry besides compression, which is refused (no
    encoding is offered): by default the servers' end-of-stream and trailers; a door reading
    what a caller sends passes 0, since a caller ends its stream with the body. Every refusal
    comes from an envelope's header, before its payload is buffered."""

    max_message_bytes: int
    flags: int = FLAG_END_STREAM | FLAG_TRAILERS
    _buffer: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        """(flags, payload) of each envelope `data` completes."""
        self._buffer += data
        while len(self._buffer) >= HEADER.size:
            flags, length = HEADER.unpack_from(self._buffer)
            if flags & FLAG_COMPRESSED:
                raise FramingError(
                    "compressed messages are not accepted (no encoding is offered)",
                    "unimplemented",
                )
            if flags & ~self.flags:
                raise FramingError(f"unknown envelope flags 0x{flags:02x}")
            if length > self.max_message_bytes:
                raise FramingError(
                    f"a message of {length} bytes is over the {self.max_message_bytes} cap",
                    "resource_exhausted",
                )
            end = HEADER.size + length
            if len(self._buffer) < end:
                return
            payload = bytes(self._buffer[HEADER.size : end])
            del self._buffer[:end]
            yield flags, payload

    def close(self) -> None:
        """The body ended: refuse a partial envelope left over."""
        if self._buffer:
            raise FramingError(f"the body ends inside an envelope ({len(self._buffer)} bytes)")


def connect_code(code: grpc.StatusCode) -> str:
    return str(code.name).lower().replace("cancelled", "canceled")


def _unpadded(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


def status_details(trailing: Iterable[tuple[str, str | bytes]]) -> status_pb2.Status | None:
    """The rich status (google.rpc.Status) a gRPC server sent in its trailers, if any."""
    for key, value in trailing:
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            try:
                return status_pb2.Status.FromString(value)
            except Exception:  # a malformed detail is dropped, the code and message remain
                return None
    return None


def connect_error(
    code: grpc.StatusCode, message: str, details: status_pb2.Status | None = None
) -> dict[str, Any]:
    """A Connect error object; each detail as `{"type", "value"}` (unpadded base64)."""
    error: dict[str, Any] = {"code": connect_code(code), "message": message}
    if details is not None and details.details:
        error["details"] = [
            {"type": d.type_url.rpartition("/")[2], "value": _unpadded(d.value)}
            for d in details.details
        ]
    return error


def end_stream(error: dict[str, Any] | None, metadata: Mapping[str, list[str]]) -> bytes:
    """A Connect stream's last envelope."""
    body: dict[str, Any] = {}
    if error is not None:
        body["error"] = error
    if metadata:
        body["metadata"] = dict(metadata)
    return envelope(json.dumps(body, separators=(",", ":")).encode(), FLAG_END_STREAM)


def grpc_web_trailers(
    code: grpc.StatusCode, message: str, extra: Iterable[tuple[str, str]] = ()
) -> bytes:
    """A gRPC-Web trailers envelope: `grpc-status`, `grpc-message` (percent-encoded) and more."""
    lines = [f"grpc-status: {code.value[0]}"]
    if message:
        lines.append(f"grpc-message: {percent_encode(message)}")
    lines += [f"{k}: {v}" for k, v in extra]
    return envelope(("\r\n".join(lines) + "\r\n").encode(), FLAG_TRAILERS)


def percent_encode(text: str) -> str:
    """gRPC's message encoding: printable ASCII but '%' as is, every other byte as %XX."""
    out = []
    for byte in text.encode():
        out.append(chr(byte) if 0x20 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}")
    return "".join(out)
