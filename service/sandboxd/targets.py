"""Strict parsing of what a container asks the proxy for: names, patterns, request heads (pure).

Below both rooms that read them: the egress proxy (`sandboxd.egress`) and the secrets
relay it hosts (`sandboxd.secrets`), so neither imports the other for these.

Everything here refuses rather than guesses. A host is a DNS name or nothing: any spelling an
IP parser would accept (`127.1`, `2130706433`, `0x7f000001`, `[::1]`, zone ids) is refused
before a lookup could happen. Request heads are parsed to the letter: CRLF line ends, single
spaces, token names, no folding, no duplicate framing headers, bounded sizes.
"""

from __future__ import annotations

import enum
import ipaddress
import re
import socket
from dataclasses import dataclass

import idna

MAX_NAME_BYTES = 253
MAX_LABEL_BYTES = 63
MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 100

_LABEL_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
_NUMERIC_LABEL_RE = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")
_PORT_RE = re.compile(r"^[1-9][0-9]{0,4}$")
_TOKEN_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_METHOD_RE = re.compile(r"^[A-Z]{1,20}$")
_VALUE_RE = re.compile(r"^[\t\x20-\x7e]*$")
_TARGET_CHARS_RE = re.compile(r"^[\x21-\x7e]+$")

# RFC 9110 7.6.1 hop-by-hop fields, plus the proxy's own; any Proxy-* field is dropped too.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


class TargetError(ValueError):
    """A refused name, port or request; `reason` is the audit word, `status` the HTTP reply."""

    def __init__(self, reason: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


def _is_ip_literal(host: str) -> bool:
    if host.startswith("[") or ":" in host or "%" in host:
        return True
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        socket.inet_aton(host)  # pure parser: accepts 127.1, 2130706433, 0x7f.1, 0177.0.0.1
        return True
    except OSError:
        pass
    # WHATWG "ends in a number": browsers read such a host as IPv4; no TLD is numeric.
    last = host.rstrip(".").rsplit(".", 1)[-1].lower()
    return bool(_NUMERIC_LABEL_RE.match(last))


def normalize_name(host: str) -> str:
    """The canonical form of a DNS name: lower case, IDNA (A-labels), no trailing dot.

    Raises TargetError IP_LITERAL for any IP spelling, INVALID_NAME for anything else odd.
    """
    if not host:
        raise TargetError("INVALID_NAME", "empty host")
    if _is_ip_literal(host):
        raise TargetError("IP_LITERAL", f"{host!r} is an IP literal; only names are allowed", 403)
    if host.endswith("."):
        host = host[:-1]
    if not host or ".." in host or host.startswith("."):
        raise TargetError("INVALID_NAME", f"{host!r} is not a DNS name")
    try:
        ascii_name = idna.encode(host, uts46=True).decode("ascii") if not host.isascii() else host
    except (idna.IDNAError, UnicodeError) as exc:
        raise TargetError("INVALID_NAME", f"{host!r} is not a valid IDNA name: {exc}") from None
    name = ascii_name.lower()
    if len(name) > MAX_NAME_BYTES:
        raise TargetError("INVALID_NAME", f"name longer than {MAX_NAME_BYTES} bytes")
    for label in name.split("."):
        if len(label) > MAX_LABEL_BYTES or not _LABEL_RE.match(label):
            raise TargetError("INVALID_NAME", f"{host!r} has an invalid label {label!r}")
    if _is_ip_literal(name):  # IDNA can turn full-width digits into an IPv4 spelling
        raise TargetError("IP_LITERAL", f"{host!r} is an IP literal; only names are allowed", 403)
    return name


def normalize_pattern(pattern: str) -> str:
    """A declared domain: an exact name or `*.name` (subdomains only). ValueError if invalid."""
    wildcard = pattern.startswith("*.")
    rest = pattern[2:] if wildcard else pattern
    if "*" in rest:
        raise TargetError("INVALID_PATTERN", f"{pattern!r}: '*' is allowed only as a '*.' prefix")
    name = normalize_name(rest)
    if wildcard and "." not in name:
        raise TargetError("INVALID_PATTERN", f"{pattern!r}: a wildcard needs a parent domain")
    return "*." + name if wildcard else name


def name_allowed(name: str, patterns: tuple[str, ...] | frozenset[str]) -> bool:
    """Whether a normalized name matches one of the normalized patterns."""
    for p in patterns:
        if p.startswith("*."):
            if name.endswith(p[1:]) and len(name) > len(p) - 1:
                return True
        elif name == p:
            return True
    return False


def parse_port(text: str) -> int:
    """Strict decimal 1-65535: no sign, no leading zero, no spaces."""
    if not _PORT_RE.match(text) or int(text) > 65535:
        raise TargetError("INVALID_PORT", f"{text!r} is not a port (decimal 1-65535)")
    return int(text)


def parse_authority(text: str, *, default_port: int | None = None) -> tuple[str, int]:
    """`host:port` (or `host` when a default port applies) -> (normalized name, port)."""
    if "@" in text:
        raise TargetError("INVALID_TARGET", "userinfo is not allowed in the target")
    if text.startswith("["):
        raise TargetError("IP_LITERAL", f"{text!r} is an IP literal; only names are allowed", 403)
    host, sep, port_text = text.rpartition(":")
    if not sep:
        if default_port is None:
            raise TargetError("INVALID_TARGET", f"{text!r}: CONNECT needs host:port")
        host, port = text, default_port
    else:
        port = parse_port(port_text)
    return normalize_name(host), port


class RequestKind(enum.Enum):
    CONNECT = "CONNECT"
    HTTP = "HTTP"


@dataclass(frozen=True)
class ProxyRequest:
    """One parsed request head: where to, and (for plain HTTP) the head to send upstream."""

    kind: RequestKind
    method: str
    host: str
    port: int
    upstream_head: bytes = b""  # plain HTTP only: origin-form, hop-by-hop fields removed
    content_length: int = 0


def parse_request_head(head: bytes) -> ProxyRequest:
    """Parse a request head ending in CRLF CRLF. Raises TargetError on anything not strict."""
    if len(head) > MAX_HEAD_BYTES:
        raise TargetError("HEAD_TOO_LARGE", "request head too large", 431)
    if not head.endswith(b"\r\n\r\n"):
        raise TargetError("MALFORMED_REQUEST", "request head must end with CRLF CRLF")
    try:
        text = head[:-4].decode("ascii")
    except UnicodeDecodeError:
        raise TargetError("MALFORMED_REQUEST", "request head is not ASCII") from None
    lines = text.split("\r\n")
    if any("\n" in line or "\r" in line or "\0" in line for line in lines):
        raise TargetError("MALFORMED_REQUEST", "bare CR, LF or NUL in the request head")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise TargetError("MALFORMED_REQUEST", "request line must be METHOD SP target SP version")
    method, target, version = parts
    if not _METHOD_RE.match(method):
        raise TargetError("MALFORMED_REQUEST", "bad method")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise TargetError("MALFORMED_REQUEST", "only HTTP/1.0 and HTTP/1.1", 505)
    if not _TARGET_CHARS_RE.match(target):
        raise TargetError("MALFORMED_REQUEST", "bad characters in the request target")
    headers = _parse_headers(lines[1:])
    if method == "CONNECT":
        host, port = parse_authority(target)
        return ProxyRequest(RequestKind.CONNECT, method, host, port)
    return _plain_http(method, target, version, headers)


def _parse_headers(lines: list[str]) -> list[tuple[str, str]]:
    if len(lines) > MAX_HEADERS:
        raise TargetError("HEAD_TOO_LARGE", f"more than {MAX_HEADERS} header fields", 431)
    headers = []
    for line in lines:
        if line[:1] in (" ", "\t"):
            raise TargetError("MALFORMED_REQUEST", "obsolete line folding is not accepted")
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN_RE.match(name):
            raise TargetError("MALFORMED_REQUEST", f"bad header field {line[:40]!r}")
        value = value.strip(" \t")
        if not _VALUE_RE.match(value):
            raise TargetError("MALFORMED_REQUEST", f"bad characters in header {name!r}")
        headers.append((name, value))
    return headers


def _plain_http(
    method: str, target: str, version: str, headers: list[tuple[str, str]]
) -> ProxyRequest:
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() != "http":
        raise TargetError(
            "INVALID_TARGET", "plain requests must be absolute-form http://; use CONNECT for TLS"
        )
    if "#" in rest:
        raise TargetError("INVALID_TARGET", "fragments are not allowed in the request target")
    slash = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:slash], rest[slash:]
    if not path.startswith("/"):
        path = "/" + path
    host, port = parse_authority(authority, default_port=80)
    lower = [(n.lower(), v) for n, v in headers]
    if any(n == "transfer-encoding" for n, _ in lower):
        raise TargetError(
            "UNSUPPORTED_REQUEST", "Transfer-Encoding request bodies are not supported", 501
        )
    lengths = [v for n, v in lower if n == "content-length"]
    if len(lengths) > 1 or (lengths and not re.fullmatch(r"[0-9]{1,15}", lengths[0])):
        raise TargetError("MALFORMED_REQUEST", "one decimal Content-Length at most")
    if sum(1 for n, _ in lower if n == "host") > 1:
        raise TargetError("MALFORMED_REQUEST", "more than one Host field")
    named = {
        t.strip().lower() for n, v in lower if n == "connection" for t in v.split(",") if t.strip()
    }
    kept = [
        (n, v)
        for (n, v), (ln, _) in zip(headers, lower, strict=True)
        if ln not in HOP_BY_HOP and ln not in named and ln != "host" and not ln.startswith("proxy-")
    ]
    authority_out = host if port == 80 else f"{host}:{port}"
    out = [f"{method} {path} {version}", f"Host: {authority_out}"]
    out += [f"{n}: {v}" for n, v in kept]
    out.append("Connection: close")
    upstream = ("\r\n".join(out) + "\r\n\r\n").encode("ascii")
    return ProxyRequest(
        RequestKind.HTTP,
        method,
        host,
        port,
        upstream_head=upstream,
        content_length=int(lengths[0]) if lengths else 0,
    )
