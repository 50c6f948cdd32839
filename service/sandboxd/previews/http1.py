"""Just enough HTTP/1.1 to relay it unchanged: heads parsed and re-encoded, bodies framed.

The relay never re-encodes a body: it learns from each head how the body is framed
(Content-Length, chunked, or until the connection closes; RFC 9112 section 6) and copies the
bytes as they are, chunk lines and trailers included, so chunked and streamed responses and
Server-Sent Events arrive exactly as the sandbox sent them. A request whose framing is
ambiguous (Transfer-Encoding with Content-Length, differing lengths, an unknown coding) is
refused with 400: relaying it would let the client and the sandbox disagree about where the
next request starts.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sandboxd.previews.dialer import ByteStream, TooLong

MAX_HEAD = 64 * 1024
MAX_CHUNK_LINE = 4096
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_DIGITS = re.compile(r"^[0-9]{1,18}$")


class BadMessage(Exception):
    """A head or body that cannot be relayed safely (400 from a client, 502 from a sandbox)."""


@dataclass
class Head:
    start: str  # request line or status line
    headers: list[tuple[str, str]] = field(default_factory=list)

    def get(self, name: str) -> str | None:
        lower = name.lower()
        values = [v for k, v in self.headers if k.lower() == lower]
        return ", ".join(values) if values else None

    def tokens(self, name: str) -> set[str]:
        value = self.get(name) or ""
        return {t.strip().lower() for t in value.split(",") if t.strip()}

    def remove(self, name: str) -> None:
        lower = name.lower()
        self.headers = [(k, v) for k, v in self.headers if k.lower() != lower]

    def encode(self) -> bytes:
        lines = [self.start, *(f"{k}: {v}" for k, v in self.headers), "", ""]
        return "\r\n".join(lines).encode("latin-1")


def parse_head(raw: bytes) -> Head:
    """A head up to and including its blank line; BadMessage if it is not HTTP/1.x."""
    lines = raw.split(b"\r\n")
    if len(lines) < 3 or lines[-2:] != [b"", b""]:
        raise BadMessage("malformed head")
    head = Head(lines[0].decode("latin-1"))
    for line in lines[1:-2]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name):
            raise BadMessage("malformed header line")  # also obs-fold (a line starting with SP)
        if b"\r" in value or b"\n" in value or b"\0" in value:
            raise BadMessage("control character in a header")
        head.headers.append((name.decode("latin-1"), value.strip(b" \t").decode("latin-1")))
    return head


async def read_head(stream: ByteStream) -> Head:
    """The next head (EOFError when the stream ends before one begins)."""
    try:
        raw = await stream.read_until(b"\r\n\r\n", MAX_HEAD)
    except TooLong:
        raise BadMessage("head too large") from None
    return parse_head(raw)


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    version: str


def request_line(head: Head) -> Request:
    parts = head.start.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha():
        raise BadMessage("malformed request line")
    return Request(parts[0], parts[1], parts[2])


def status_of(head: Head) -> tuple[str, int]:
    parts = head.start.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise BadMessage("malformed status line")
    return parts[0], int(parts[1])


# Body framing: ("none",), ("length", n), ("chunked",), ("close",)
Framing = tuple[str, int]
NONE: Framing = ("none", 0)
CHUNKED: Framing = ("chunked", 0)
UNTIL_CLOSE: Framing = ("close", 0)


def _length(head: Head) -> int | None:
    found = [v for k, v in head.headers if k.lower() == "content-length"]
    lengths = {x.strip() for v in found for x in v.split(",")}
    if not lengths:
        return None
    if len(lengths) != 1 or not _DIGITS.match(next(iter(lengths))):
        raise BadMessage("invalid Content-Length")
    return int(next(iter(lengths)))


def request_framing(head: Head) -> Framing:
    coding = head.get("transfer-encoding")
    length = _length(head)
    if coding is not None:
        if length is not None or [c.strip().lower() for c in coding.split(",")] != ["chunked"]:
            raise BadMessage("ambiguous or unsupported Transfer-Encoding")
        return CHUNKED
    return ("length", length) if length else NONE


def response_framing(head: Head, method: str, status: int) -> Framing:
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return NONE
    coding = head.get("transfer-encoding")
    if coding is not None:
        last = coding.split(",")[-1].strip().lower()
        return CHUNKED if last == "chunked" else UNTIL_CLOSE
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
    while True:
        line = await _line(source)
        size_text = line.split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 16 or not re.match(rb"^[0-9A-Fa-f]+$", size_text):
            raise BadMessage("invalid chunk size")
        size = int(size_text, 16)
        await sink(line)
        if size == 0:
            while True:  # trailers, then the blank line
                trailer = await _line(source)
                await sink(trailer)
                if trailer == b"\r\n":
                    return
        await relay_body(source, sink, ("length", size))
        if await source.read_exactly(2) != b"\r\n":
            raise BadMessage("chunk not followed by CRLF")
        await sink(b"\r\n")
