"""Just enough HTTP/1.1 to relay it unchanged: heads parsed and re-encoded, bodies framed.

Heads are parsed by llhttp (`httptools`, Node's parser), which refuses by design what lets two
parsers disagree about a message: Content-Length with Transfer-Encoding, duplicate or listed
Content-Length, a request's Transfer-Encoding other than chunked last, obs-fold, bare CR or
LF, NUL and other controls, whitespace before a colon, an invalid method, target or version.
The head is fed to it as it arrives, so a bad byte is refused at once, not when the head ends.
On top, the checks llhttp leaves to its caller: only HTTP/1.0 and 1.1, at most one Host (and
one in a 1.1 request), no Transfer-Encoding in a 1.0 request, a status of three digits and a
reason without controls. What is relayed is the head re-encoded from what was parsed, so the
sandbox (and the client) read exactly what the listener read.

The relay never re-encodes a body: it learns from each head how the body is framed
(Content-Length, chunked, or until the connection closes; RFC 9112 section 6) and copies the
bytes as they are, chunk lines and trailers included (each checked against the grammar
first), so chunked and streamed answers and Server-Sent Events arrive as the sandbox sent them.
A message whose framing is ambiguous is refused (400 from a client, 502 from a sandbox):
relaying it would let the two ends disagree about where the next message starts.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httptools

from sandboxd.previews.dialer import ByteStream, TooLong

MAX_HEAD = 64 * 1024
MAX_CHUNK_LINE = 4096
MAX_TRAILERS = 64  # trailer lines of one chunked body (each at most MAX_CHUNK_LINE)
_DIGITS = re.compile(r"^[0-9]{1,18}$")
_CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[\t\x20\x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t\x20-\x7e\x80-\xff])*"'
_CHUNK_LINE = re.compile(
    rb"^([0-9A-Fa-f]{1,16})(?:[ \t]*;[ \t]*"
    + _TOKEN
    + rb"(?:[ \t]*=[ \t]*(?:"
    + _TOKEN
    + rb"|"
    + _QUOTED
    + rb"))?)*[ \t]*\r\n$"
)
_TRAILER_LINE = re.compile(rb"^" + _TOKEN + rb":[\t\x20-\x7e\x80-\xff]*\r\n$")


class BadMessage(Exception):
    """A head or body that cannot be relayed safely (400 from a client, 502 from a sandbox)."""


@dataclass
class Head:
    start: str  # request line or status line
    headers: list[tuple[str, str]] = field(default_factory=list)
    version: str = "HTTP/1.1"
    method: str = ""  # of a request
    target: str = ""  # of a request
    status: int = 0  # of an answer

    def get(self, name: str) -> str | None:
        lower = name.lower()
        values = [v for k, v in self.headers if k.lower() == lower]
        return ", ".join(values) if values else None

    def count(self, name: str) -> int:
        lower = name.lower()
        return sum(1 for k, _ in self.headers if k.lower() == lower)

    def tokens(self, name: str) -> set[str]:
        value = self.get(name) or ""
        return {t.strip().lower() for t in value.split(",") if t.strip()}

    def remove(self, name: str) -> None:
        lower = name.lower()
        self.headers = [(k, v) for k, v in self.headers if k.lower() != lower]

    def encode(self) -> bytes:
        lines = [self.start, *(f"{k}: {v}" for k, v in self.headers), "", ""]
        return "\r\n".join(lines).encode("latin-1")


class _Collect:
    """llhttp's callbacks: the parts of one head."""

    def __init__(self) -> None:
        self.url = b""
        self.reason = b""
        self.headers: list[tuple[str, str]] = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        text = value.decode("latin-1").strip(" \t")
        self.headers.append((name.decode("latin-1"), text))

    def on_headers_complete(self) -> None:
        self.complete = True


class _HeadParser:
    """One head fed to llhttp piece by piece; `head()` once its blank line was fed."""

    def __init__(self, request: bool) -> None:
        self._request = request
        self._parts = _Collect()
        self._parser: httptools.HttpRequestParser | httptools.HttpResponseParser = (
            httptools.HttpRequestParser(self._parts)
            if request
            else httptools.HttpResponseParser(self._parts)
        )

    def feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # the head asks for (or, in an answer, grants) an upgrade: checked by the relay
        except httptools.HttpParserError as exc:
            # llhttp stops at a 101 that grants no upgrade it knows: the head itself is whole.
            if not (self._parts.complete and not self._request):
                raise BadMessage(f"malformed head: {exc}") from None

    def head(self) -> Head:
        if not self._parts.complete:
            raise BadMessage("malformed head")
        version = "HTTP/" + self._parser.get_http_version()
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            raise BadMessage(f"unsupported version {version}")
        parts = self._parts
        if any(_CONTROLS.search(k) or _CONTROLS.search(v) for k, v in parts.headers):
            raise BadMessage("control character in a header")
        hosts = sum(1 for k, _ in parts.headers if k.lower() == "host")
        if isinstance(self._parser, httptools.HttpRequestParser):
            method = self._parser.get_method().decode("ascii")
            target = parts.url.decode("latin-1")
            if hosts > 1 or (hosts == 0 and version == "HTTP/1.1"):
                raise BadMessage("a request has exactly one Host")
            chunked = any(k.lower() == "transfer-encoding" for k, _ in parts.headers)
            if version == "HTTP/1.0" and chunked:
                raise BadMessage("Transfer-Encoding in an HTTP/1.0 request")
            start = f"{method} {target} {version}"
            return Head(start, parts.headers, version, method=method, target=target)
        status = self._parser.get_status_code()
        reason = parts.reason.decode("latin-1")
        if not 100 <= status <= 599 or _CONTROLS.search(reason):
            raise BadMessage("malformed status line")
        start = f"{version} {status} {reason}" if reason else f"{version} {status}"
        return Head(start, parts.headers, version, status=status)


def parse_request(raw: bytes) -> Head:
    """A whole request head (through its blank line); BadMessage if it is not sound."""
    parser = _HeadParser(request=True)
    parser.feed(raw)
    return parser.head()


def parse_response(raw: bytes) -> Head:
    """A whole answer head (through its blank line); BadMessage if it is not sound."""
    parser = _HeadParser(request=False)
    parser.feed(raw)
    return parser.head()


async def _read_head(stream: ByteStream, request: bool) -> Head:
    parser = _HeadParser(request)
    try:
        await stream.read_until(b"\r\n\r\n", MAX_HEAD, parser.feed)
    except TooLong:
        raise BadMessage("head too large") from None
    return parser.head()


async def read_request(stream: ByteStream) -> Head:
    """The next request head (EOFError when the stream ends before one is whole)."""
    return await _read_head(stream, request=True)


async def read_response(stream: ByteStream) -> Head:
    """The next answer head (EOFError when the stream ends before one is whole)."""
    return await _read_head(stream, request=False)


# Body framing: ("none",), ("length", n), ("chunked",), ("close",)
Framing = tuple[str, int]
NONE: Framing = ("none", 0)
CHUNKED: Framing = ("chunked", 0)
UNTIL_CLOSE: Framing = ("close", 0)


def _length(head: Head) -> int | None:
    found = [v for k, v in head.headers if k.lower() == "content-length"]
    if not found:
        return None
    if len(found) != 1 or not _DIGITS.match(found[0]):
        raise BadMessage("invalid Content-Length")
    return int(found[0])


def request_framing(head: Head) -> Framing:
    coding = head.get("transfer-encoding")
    length = _length(head)
    if coding is not None:
        if length is not None or [c.strip().lower() for c in coding.split(",")] != ["chunked"]:
            raise BadMessage("ambiguous or unsupported Transfer-Encoding")
        return CHUNKED
    return ("length", length) if length else NONE


def bodiless(method: str, status: int) -> bool:
    """An answer that has no body whatever its head says (RFC 9112 section 6.3)."""
    return method == "HEAD" or status in (204, 304) or 100 <= status < 200


def declares_body(head: Head) -> bool:
    """Whether a head says a body follows (on a bodiless answer: the sandbox may send one,
    which leaves bytes on its connection that are no answer to anything)."""
    return head.get("transfer-encoding") is not None or (_length(head) or 0) > 0


def response_framing(head: Head, method: str, status: int) -> Framing:
    if bodiless(method, status):
        return NONE
    coding = head.get("transfer-encoding")
    if coding is not None:
        codings = [c.strip().lower() for c in coding.split(",")]
        if codings.count("chunked") > 1:
            # RFC 9112 6.1: chunked is never applied twice; a client may read such a body
            # once de-chunked or refuse it, either way not as the relay framed it.
            raise BadMessage("Transfer-Encoding chunked more than once")
        return CHUNKED if codings[-1] == "chunked" else UNTIL_CLOSE
    length = _length(head)
    return UNTIL_CLOSE if length is None else (("length", length) if length else NONE)


Sink = Callable[[bytes], Awaitable[None]]


async def relay_body(source: ByteStream, sink: Sink, framing: Framing) -> None:
    """Copy one body as it is framed; EOFError if the source ends inside it."""
    kind, length = framing
    if kind == "length":
        while length > 0:
            data = await source.read_some(length)
            if not data:
                raise EOFError
            length -= len(data)
            await sink(data)
    elif kind == "chunked":
        await _relay_chunked(source, sink)
    elif kind == "close":
        while data := await source.read_some():
            await sink(data)


async def _line(source: ByteStream) -> bytes:
    try:
        return await source.read_until(b"\r\n", MAX_CHUNK_LINE)
    except TooLong:
        raise BadMessage("chunk line too long") from None


async def _relay_chunked(source: ByteStream, sink: Sink) -> None:
    """Chunk lines and trailers are checked whole before they are passed on: a bare CR or LF,
    a control or a size with leading spaces or `0x` would be read otherwise by a lenient
    parser at the other end."""
    while True:
        line = await _line(source)
        m = _CHUNK_LINE.match(line)
        if m is None:
            raise BadMessage("invalid chunk line")
        size = int(m.group(1), 16)
        await sink(line)
        if size == 0:
            for _ in range(MAX_TRAILERS + 1):  # trailers, then the blank line
                trailer = await _line(source)
                if trailer != b"\r\n" and not _TRAILER_LINE.match(trailer):
                    raise BadMessage("invalid trailer line")
                await sink(trailer)
                if trailer == b"\r\n":
                    return
            raise BadMessage("too many trailer lines")
        await relay_body(source, sink, ("length", size))
        if await source.read_exactly(2) != b"\r\n":
            raise BadMessage("chunk not followed by CRLF")
        await sink(b"\r\n")
