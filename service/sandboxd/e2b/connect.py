"""The Connect protocol (v1) with the JSON codec, as E2B's envd speaks it: the framing only.

Unary calls are a JSON body (`application/json`) answered by one JSON body, an error by an HTTP
status and `{"code", "message"}`. Streams (`application/connect+json`) are enveloped: each
message is a flags byte, a 4-byte big-endian length and the JSON; the server's last envelope has
flag 0x02 (end of stream) and carries `{}` or `{"error": {...}}`. Compressed envelopes (flag
0x01) are refused: no compression is offered. Pure: no I/O, so every malformed input is a unit
test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import grpc

from sandboxd.connect import FLAG_COMPRESSED, FLAG_END_STREAM, HEADER, connect_code
from sandboxd.connect import HTTP_STATUS as GRPC_HTTP_STATUS

UNARY_CONTENT_TYPE = "application/json"
STREAM_CONTENT_TYPE = "application/connect+json"

# Connect's codes and the HTTP status of a unary error: the protocol's one table, shared with
# the web gateway (sandboxd.connect), here keyed by the code's Connect name.
HTTP_STATUS = {connect_code(code): status for code, status in GRPC_HTTP_STATUS.items()}


@dataclass
class ConnectError(Exception):
    """An answer of the Connect protocol: its code (snake case) and a message for the caller."""

    code: str
    message: str

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message}

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)


def code_of(status: grpc.StatusCode) -> str:
    """gRPC's code as Connect names it (snake case; CANCELLED is spelled `canceled`)."""
    return connect_code(status)


def from_rpc_error(exc: grpc.aio.AioRpcError) -> ConnectError:
    return ConnectError(code_of(exc.code()), exc.details() or code_of(exc.code()))


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return HEADER.pack(flags, len(data)) + data


def end_stream(error: ConnectError | None = None) -> bytes:
    return envelope({} if error is None else {"error": error.body()}, FLAG_END_STREAM)


def decode_json(data: bytes) -> dict[str, Any]:
    """One message of the JSON codec: an object, else INVALID_ARGUMENT."""
    try:
        value = json.loads(data) if data.strip() else {}
    except (UnicodeDecodeError, ValueError):
        raise ConnectError("invalid_argument", "the message is not valid JSON") from None
    if not isinstance(value, dict):
        raise ConnectError("invalid_argument", "the message is not a JSON object")
    return value


class EnvelopeReader:
    """Cuts a byte stream into envelopes, holding at most one message of `max_bytes`.

    Feed it the body as it arrives; `messages()` yields every whole message so far. A frame
    that announces more than `max_bytes`, is compressed, or carries an end-of-stream flag from
    a client is refused before its payload is read; `finish()` refuses a body cut mid-frame."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        out: list[dict[str, Any]] = []
        while len(self._buf) >= HEADER.size:
            flags, size = HEADER.unpack_from(self._buf)
            if flags & FLAG_COMPRESSED:
                raise ConnectError("unimplemented", "compressed messages are not supported")
            if flags & ~FLAG_COMPRESSED:
                raise ConnectError("invalid_argument", f"unknown envelope flags 0x{flags:02x}")
            if size > self._max:
                raise ConnectError(
                    "resource_exhausted",
                    f"a message of {size} bytes is over the limit of {self._max}",
                )
            if len(self._buf) < HEADER.size + size:
                break
            payload = bytes(self._buf[HEADER.size : HEADER.size + size])
            del self._buf[: HEADER.size + size]
            out.append(decode_json(payload))
        if len(self._buf) > self._max + HEADER.size:  # pragma: no cover - bounded above
            raise ConnectError("resource_exhausted", "message over the limit")
        return out

    def finish(self) -> None:
        if self._buf:
            raise ConnectError(
                "invalid_argument", f"the request ended inside a frame ({len(self._buf)} bytes)"
            )


def timeout_s(header: str | None) -> float | None:
    """Connect-Timeout-Ms: at most 10 digits of milliseconds (the protocol's rule)."""
    if header is None:
        return None
    if not header.isdigit() or len(header) > 10:
        raise ConnectError("invalid_argument", "connect-timeout-ms must be 1 to 10 digits")
    return int(header) / 1000
