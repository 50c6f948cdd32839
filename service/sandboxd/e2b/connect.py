"""The Connect protocol (v1) with the JSON codec, as E2B's envd speaks it: the framing only.

Unary calls are a JSON body (`application/json`) answered by one JSON body, an error by an HTTP
status and `{"code", "message"}`. Streams (`application/connect+json`) are enveloped: each
message is a flags byte, a 4-byte big-endian length and the JSON; the server's last envelope has
flag 0x02 (end of stream) and carries `{}` or `{"error": {...}}`. The envelopes themselves are
`sandboxd.connect`'s, shared with the web gateway. Pure: no I/O, so every malformed input is a
unit test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import grpc

from sandboxd.connect import (
    FLAG_END_STREAM,
    HEADER,
    EnvelopeReader,
    FramingError,
    connect_code,
)
from sandboxd.connect import HTTP_STATUS as GRPC_HTTP_STATUS
from sandboxd.digits import decimal

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


class JsonMessages:
    """The JSON messages of a caller's stream, as its body arrives, holding at most one
    message of `max_bytes`: the framing is the one Connect reader's (`sandboxd.connect`), with
    no flags a caller may set; what it refuses is answered with its Connect code.
    `finish()` refuses a body cut mid-frame."""

    def __init__(self, max_bytes: int) -> None:
        self._reader = EnvelopeReader(max_bytes, flags=0)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        try:
            return [decode_json(payload) for _, payload in self._reader.feed(data)]
        except FramingError as exc:
            raise ConnectError(exc.code, str(exc)) from None

    def finish(self) -> None:
        try:
            self._reader.close()
        except FramingError as exc:
            raise ConnectError(exc.code, str(exc)) from None


def timeout_s(header: str | None) -> float | None:
    """Connect-Timeout-Ms: at most 10 digits of milliseconds (the protocol's rule)."""
    if header is None:
        return None
    ms = decimal(header, max_digits=10)
    if ms is None:
        raise ConnectError("invalid_argument", "connect-timeout-ms must be 1 to 10 digits")
    return ms / 1000
