"""What a web request speaks (from its Content-Type), its deadline, and the headers it may pass
on: pure functions of the request's headers.

- Connect unary: `application/proto` or `application/json`, the body one message.
- Connect streaming: `application/connect+proto` or `+json`, the body enveloped.
- gRPC-Web: `application/grpc-web`, `+proto`, `+json`, and the base64 text forms
  `application/grpc-web-text[+proto]`, the body enveloped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from sandboxd.digits import decimal

CONNECT_UNARY = "connect-unary"
CONNECT_STREAM = "connect-stream"
GRPC_WEB = "grpc-web"

# Request headers passed on to the gRPC server as metadata: the credentials and the trace
# context. Nothing else: cookies, and any other header a browser adds on its own, never reach
# the API, so it cannot act on ambient credentials.
FORWARDED = ("authorization", "traceparent", "tracestate")

_GRPC_TIMEOUT = re.compile(r"\A([0-9]{1,8})([HMSmun])\Z")
_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


class ProtocolError(ValueError):
    """A request whose headers are not a Connect or gRPC-Web call the gateway can take."""


@dataclass(frozen=True)
class Protocol:
    """How a request is framed and encoded, and how its reply must be."""

    kind: str  # CONNECT_UNARY, CONNECT_STREAM or GRPC_WEB
    codec: str  # "proto" or "json"
    text: bool = False  # gRPC-Web's base64 text form
    content_type: str = ""  # of the reply

    @property
    def streaming(self) -> bool:
        return self.kind != CONNECT_UNARY


def protocol_of(content_type: str) -> Protocol | None:
    """The protocol of a Content-Type (parameters ignored), or None for one not spoken here."""
    ct = content_type.split(";")[0].strip().lower()
    if ct in ("application/proto", "application/json"):
        return Protocol(CONNECT_UNARY, ct.removeprefix("application/"), content_type=ct)
    if ct in ("application/connect+proto", "application/connect+json"):
        return Protocol(CONNECT_STREAM, ct.rpartition("+")[2], content_type=ct)
    for base, text in (("application/grpc-web-text", True), ("application/grpc-web", False)):
        if ct == base or ct.startswith(base + "+"):
            codec = ct[len(base) + 1 :] or "proto"
            if codec not in ("proto", "json") or (text and codec != "proto"):
                return None
            return Protocol(GRPC_WEB, codec, text, f"{base}+{codec}")
    return None


def deadline_of(protocol: Protocol, headers: Mapping[str, str]) -> float | None:
    """The call's timeout in seconds, from `connect-timeout-ms` or `grpc-timeout`."""
    if protocol.kind == GRPC_WEB:
        value = headers.get("grpc-timeout")
        if value is None:
            return None
        m = _GRPC_TIMEOUT.match(value.strip())
        if m is None:
            raise ProtocolError(f"grpc-timeout {value!r}: expected up to 8 digits and a unit")
        return int(m.group(1)) * _UNITS[m.group(2)]
    value = headers.get("connect-timeout-ms")
    if value is None:
        return None
    ms = decimal(value.strip(), max_digits=10)
    if ms is None:
        raise ProtocolError(f"connect-timeout-ms {value!r}: expected up to 10 digits")
    return ms / 1000.0


def forwarded_metadata(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The request headers the gRPC server sees, as metadata."""
    return [(name, headers[name]) for name in FORWARDED if name in headers]


def check_connect_version(protocol: Protocol, headers: Mapping[str, str]) -> None:
    """Connect's optional `connect-protocol-version` header, when sent, must say 1."""
    version = headers.get("connect-protocol-version")
    if protocol.kind != GRPC_WEB and version is not None and version.strip() != "1":
        raise ProtocolError(f"connect-protocol-version {version!r}: only 1 is spoken")
