"""Table tests of the egress target parser: names, patterns, ports, request heads."""

from __future__ import annotations

import pytest
from sandboxd.targets import (
    RequestKind,
    TargetError,
    name_allowed,
    normalize_name,
    normalize_pattern,
    parse_authority,
    parse_port,
    parse_request_head,
)

IP_LITERALS = [
    "127.0.0.1",
    "127.1",
    "127.0.1",
    "2130706433",
    "0x7f000001",
    "0x7f.0.0.1",
    "0177.0.0.1",
    "017700000001",
    "1.2.3.4",
    "8.8.8.8.",
    "[::1]",
    "[::ffff:7f00:1]",
    "[::ffff:127.0.0.1]",
    "::1",
    "::ffff:7f00:1",
    "fe80::1%eth0",
    "[fe80::1%25eth0]",
    "169.254.169.254",
    "0",
    "0x0",
    "example.123",  # ends in a number: read as IPv4 by URL parsers
    "example.0x1f",
    "１２７.０.０.１",  # full-width digits, folded by IDNA
]


@pytest.mark.parametrize("host", IP_LITERALS)
def test_ip_literals_refused(host: str) -> None:
    with pytest.raises(TargetError) as exc:
        normalize_name(host)
    assert exc.value.reason == "IP_LITERAL", exc.value


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("example.com", "example.com"),
        ("EXAMPLE.Com", "example.com"),
        ("example.com.", "example.com"),
        ("a-b.example.com", "a-b.example.com"),
        ("bücher.de", "xn--bcher-kva.de"),
        ("BÜCHER.de", "xn--bcher-kva.de"),
        ("xn--bcher-kva.de", "xn--bcher-kva.de"),
        ("localhost", "localhost"),
        ("1.2.3.4.example", "1.2.3.4.example"),
        ("a" * 63 + ".com", "a" * 63 + ".com"),
    ],
)
def test_names_normalized(host: str, expected: str) -> None:
    assert normalize_name(host) == expected


@pytest.mark.parametrize(
    "host",
    [
        "",
        ".",
        ".example.com",
        "example..com",
        "example.com..",
        "-example.com",
        "example-.com",
        "exa_mple.com",
        "exa mple.com",
        "example.com/",
        "a" * 64 + ".com",
        ("a" * 62 + ".") * 4 + "com",  # over 253 bytes
        "ex*ample.com",
        "user@example.com",
    ],
)
def test_bad_names_refused(host: str) -> None:
    with pytest.raises(TargetError):
        normalize_name(host)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("example.com", "example.com"),
        ("*.Example.COM.", "*.example.com"),
        ("*.bücher.de", "*.xn--bcher-kva.de"),
    ],
)
def test_patterns(pattern: str, expected: str) -> None:
    assert normalize_pattern(pattern) == expected


@pytest.mark.parametrize(
    "pattern",
    ["*", "*.", "*.com.*", "a.*.com", "**.example.com", "*example.com", "10.0.0.1", "*.1"],
)
def test_bad_patterns(pattern: str) -> None:
    with pytest.raises(TargetError):
        normalize_pattern(pattern)


@pytest.mark.parametrize(
    ("name", "patterns", "allowed"),
    [
        ("example.com", ("example.com",), True),
        ("www.example.com", ("example.com",), False),
        ("example.com", ("*.example.com",), False),  # subdomains only
        ("a.example.com", ("*.example.com",), True),
        ("a.b.example.com", ("*.example.com",), True),
        ("badexample.com", ("*.example.com",), False),
        ("example.com.evil", ("example.com",), False),
        ("evil-example.com", ("example.com",), False),
        ("xn--bcher-kva.de", ("xn--bcher-kva.de",), True),
        ("other.org", ("example.com", "*.example.com"), False),
    ],
)
def test_name_matching(name: str, patterns: tuple[str, ...], allowed: bool) -> None:
    assert name_allowed(name, patterns) is allowed


@pytest.mark.parametrize("text", ["1", "80", "443", "65535"])
def test_ports(text: str) -> None:
    assert parse_port(text) == int(text)


@pytest.mark.parametrize(
    "text", ["", "0", "65536", "99999", "-1", "+80", "080", " 80", "80 ", "8_0", "0x50", "٨٠"]
)
def test_bad_ports(text: str) -> None:
    with pytest.raises(TargetError):
        parse_port(text)


def test_authority() -> None:
    assert parse_authority("Example.com:443") == ("example.com", 443)
    assert parse_authority("example.com", default_port=80) == ("example.com", 80)
    for bad in ("example.com", "example.com:", ":443", "u@example.com:443", "[::1]:443"):
        with pytest.raises(TargetError):
            parse_authority(bad)


def test_connect_head() -> None:
    req = parse_request_head(b"CONNECT Example.COM:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (req.kind, req.host, req.port) == (RequestKind.CONNECT, "example.com", 443)


def test_plain_http_head_rewritten() -> None:
    req = parse_request_head(
        b"POST http://api.example.com:8080/v1/x?y=1 HTTP/1.1\r\n"
        b"Host: evil.example\r\n"
        b"Proxy-Authorization: Basic eA==\r\n"
        b"Proxy-Connection: keep-alive\r\n"
        b"Connection: keep-alive, X-Drop\r\n"
        b"X-Drop: 1\r\n"
        b"Keep-Alive: 5\r\n"
        b"Upgrade: websocket\r\n"
        b"TE: trailers\r\n"
        b"Content-Length: 3\r\n"
        b"Accept: */*\r\n\r\n"
    )
    assert (req.kind, req.host, req.port, req.content_length) == (
        RequestKind.HTTP,
        "api.example.com",
        8080,
        3,
    )
    assert req.upstream_head == (
        b"POST /v1/x?y=1 HTTP/1.1\r\nHost: api.example.com:8080\r\nContent-Length: 3\r\n"
        b"Accept: */*\r\nConnection: close\r\n\r\n"
    )


def test_plain_http_default_port_and_empty_path() -> None:
    req = parse_request_head(b"GET http://example.com HTTP/1.0\r\n\r\n")
    assert (req.host, req.port) == ("example.com", 80)
    assert req.upstream_head.startswith(b"GET / HTTP/1.0\r\nHost: example.com\r\n")


BAD_HEADS = [
    (b"CONNECT example.com:443 HTTP/1.1\n\n", "MALFORMED_REQUEST"),  # bare LF
    (b"CONNECT example.com:443 HTTP/1.1\r\nA: b\nC: d\r\n\r\n", "MALFORMED_REQUEST"),
    (b"CONNECT  example.com:443 HTTP/1.1\r\n\r\n", "MALFORMED_REQUEST"),  # double space
    (b"CONNECT example.com:443 HTTP/2.0\r\n\r\n", "MALFORMED_REQUEST"),
    (b"connect example.com:443 HTTP/1.1\r\n\r\n", "MALFORMED_REQUEST"),
    (b"CONNECT example.com:443 HTTP/1.1\r\n folded\r\n\r\n", "MALFORMED_REQUEST"),
    (b"CONNECT example.com:443 HTTP/1.1\r\nBad Name: x\r\n\r\n", "MALFORMED_REQUEST"),
    (b"CONNECT example.com:443 HTTP/1.1\r\nName : x\r\n\r\n", "MALFORMED_REQUEST"),
    (b"CONNECT example.com:443 HTTP/1.1\r\nX: \x01\r\n\r\n", "MALFORMED_REQUEST"),
    (b"CONNECT example.com:443 HTTP/1.1\r\nX: \xff\r\n\r\n", "MALFORMED_REQUEST"),
    (b"CONNECT example.com:0443 HTTP/1.1\r\n\r\n", "INVALID_PORT"),
    (b"CONNECT example.com HTTP/1.1\r\n\r\n", "INVALID_TARGET"),
    (b"CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n", "IP_LITERAL"),
    (b"CONNECT 2130706433:443 HTTP/1.1\r\n\r\n", "IP_LITERAL"),
    (b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n", "IP_LITERAL"),
    (b"GET http://127.1/ HTTP/1.1\r\n\r\n", "IP_LITERAL"),
    (b"GET http://[::ffff:7f00:1]/ HTTP/1.1\r\n\r\n", "IP_LITERAL"),
    (b"GET http://0x7f000001:80/ HTTP/1.1\r\n\r\n", "IP_LITERAL"),
    (b"GET /relative HTTP/1.1\r\nHost: example.com\r\n\r\n", "INVALID_TARGET"),
    (b"GET https://example.com/ HTTP/1.1\r\n\r\n", "INVALID_TARGET"),
    (b"GET http://user:pw@example.com/ HTTP/1.1\r\n\r\n", "INVALID_TARGET"),
    (b"GET http://example.com/#frag HTTP/1.1\r\n\r\n", "INVALID_TARGET"),
    (
        b"POST http://example.com/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        "UNSUPPORTED_REQUEST",
    ),
    (
        b"POST http://example.com/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "MALFORMED_REQUEST",
    ),
    (b"POST http://example.com/ HTTP/1.1\r\nContent-Length: -1\r\n\r\n", "MALFORMED_REQUEST"),
    (b"GET http://example.com/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "MALFORMED_REQUEST"),
    (b"CONNECT example.com:443 HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", "HEAD_TOO_LARGE"),
    (b"CONNECT example.com:443 HTTP/1.1\r\n", "MALFORMED_REQUEST"),  # unterminated
]


@pytest.mark.parametrize(("head", "reason"), BAD_HEADS)
def test_bad_heads(head: bytes, reason: str) -> None:
    with pytest.raises(TargetError) as exc:
        parse_request_head(head)
    assert exc.value.reason == reason, exc.value
