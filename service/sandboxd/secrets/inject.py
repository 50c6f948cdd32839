"""HTTP/1.1 heads inside an intercepted connection: strict parsing, and the secrets put in.

Only header fields are rewritten (never the request line or a body): a value in a URL ends
up in upstream logs. A placeholder of a secret not bound to the host is left as it is and
reported as misdirected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sandboxd.digits import decimal
from sandboxd.models import SecretBinding
from sandboxd.secrets.bindings import SLOT
from sandboxd.targets import MAX_HEADERS, TargetError, name_allowed, parse_authority


class HeadError(Exception):
    """A head the relay will not forward (becomes a 400 to the sandbox)."""


@dataclass
class Head:
    start: str  # request line or status line
    fields: list[tuple[str, str]]

    def get(self, name: str) -> list[str]:
        low = name.lower()
        return [v for k, v in self.fields if k.lower() == low]

    def encode(self) -> bytes:
        lines = [self.start, *(f"{k}: {v}" for k, v in self.fields)]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_head(raw: bytes) -> Head:
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise HeadError("undecodable head") from None
    lines = text[: -4 if text.endswith("\r\n\r\n") else len(text)].split("\r\n")
    if len(lines) - 1 > MAX_HEADERS:
        raise HeadError("too many header fields")
    start, fields = lines[0], []
    if "\n" in start or "\r" in start or "\0" in start:
        raise HeadError("bad start line")
    for line in lines[1:]:
        if not line or line[0] in " \t":
            raise HeadError("obsolete line folding")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or any(c in line for c in "\r\n\0"):
            raise HeadError("malformed header field")
        fields.append((name, value.strip(" \t")))
    return Head(start, fields)


def body_framing(head: Head) -> int | None:
    """Request body: its length, or None for chunked. Both or an odd coding: HeadError."""
    te = head.get("transfer-encoding")
    cl = head.get("content-length")
    if te and cl:
        raise HeadError("both Transfer-Encoding and Content-Length")
    if te:
        if [t.strip().lower() for t in ",".join(te).split(",")] != ["chunked"]:
            raise HeadError("unsupported transfer coding")
        return None
    return content_length(head) if cl else 0


def content_length(head: Head) -> int:
    """The one Content-Length value (repeats must agree), plain decimal; HeadError otherwise."""
    cl = head.get("content-length")
    length = decimal(cl[0], max_digits=18) if cl and len(set(cl)) == 1 else None
    if length is None:
        raise HeadError("bad Content-Length")
    return length


class HostMismatch(Exception):
    """A request inside the intercepted connection for a name other than the CONNECT's."""


def check_host(head: Head, host: str) -> None:
    """The request is for `host` itself: one Host field naming it, and an absolute-form
    target (if any) naming it too. Else a shared front end (a CDN) could route a request
    carrying the secret to another site behind it (domain fronting)."""
    hosts = head.get("host")
    if len(hosts) != 1:
        raise HostMismatch("a request needs exactly one Host field")
    authorities = [hosts[0]]
    target = head.start.split(" ")[1] if head.start.count(" ") == 2 else ""
    if "://" in target:
        authorities.append(target.split("://", 1)[1].split("/", 1)[0])
    for authority in authorities:
        try:
            name, _ = parse_authority(authority, default_port=443)
        except TargetError:
            raise HostMismatch(f"{authority[:100]!r} is not a host name") from None
        if name != host:
            raise HostMismatch(f"this connection is for {host}, not {name}")


@dataclass
class Outcome:
    head: Head
    injected: list[str] = field(default_factory=list)
    misdirected: list[str] = field(default_factory=list)


def inject(
    head: Head,
    host: str,
    bindings: Sequence[SecretBinding],
    value_of: Callable[[SecretBinding], bytes],
) -> Outcome:
    """The head to send upstream; `value_of` may raise SecretUnavailable (nothing is sent)."""
    out = Outcome(Head(head.start, list(head.fields)))
    raw = head.encode()
    for b in bindings:
        present = b.placeholder.encode() in raw
        if not name_allowed(host, b.hosts):
            if present:
                out.misdirected.append(b.name)
            continue
        if b.header:
            value = b.template.replace(SLOT, value_of(b).decode("latin-1"))
            low = b.header.lower()
            out.head.fields = [(k, v) for k, v in out.head.fields if k.lower() != low]
            out.head.fields.append((b.header, value))
            out.injected.append(b.name)
        elif present:
            value = value_of(b).decode("latin-1")
            out.head.fields = [(k, v.replace(b.placeholder, value)) for k, v in out.head.fields]
            out.injected.append(b.name)
    return out


def bound(host: str, bindings: Sequence[SecretBinding]) -> bool:
    return any(name_allowed(host, b.hosts) for b in bindings)


def misdirected(data: bytes, bindings: Sequence[SecretBinding]) -> list[str]:
    """Secrets whose placeholder is in `data` (a plain request: never a value)."""
    return [b.name for b in bindings if b.placeholder.encode() in data]
