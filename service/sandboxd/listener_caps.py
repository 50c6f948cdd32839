"""Open connections capped at accept, for the listeners a library serves (the E2B door's
hypercorn, the web gateway's aiohttp): in all, and per source address.

Neither library caps the connections it holds, and a connection costs the server a descriptor
and the library's buffers from its accept on, before it has sent a byte: a flood of idle ones
from one address would hold every place while others wait. Both libraries serve a listening
socket through asyncio, which takes each connection with the socket's own `accept()`; so the
cap is a listening socket whose `accept()` closes at once a connection past a cap (before any
byte is read, as the gRPC port's `max_connections` does) and hands over the others as sockets
that give their place back when they close. No task, no timer, nothing per byte.

A source is the peer's IPv4 address, or its IPv6 /64 (what one host is usually given), as the
preview listener counts its pending connections.
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import logging
import socket
import time
from dataclasses import dataclass, field

from sandboxd.errors import ConfigError

log = logging.getLogger("sandboxd.server")

REFUSED_PER_ACCEPT = 64  # then back to the loop: a flood waits its turn with other work
LOG_EVERY_S = 10.0


def source_of(peername: object) -> str:
    """The address a per-source cap counts: the peer's IPv4 address, or its IPv6 /64."""
    host = peername[0] if isinstance(peername, tuple) and peername else str(peername)
    try:
        address = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return str(host)
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@dataclass
class ConnectionCaps:
    """The places of one listener (0: no cap), checked and counted with no await between."""

    name: str  # the listener, in the log: "E2B door", "web gateway"
    max_open: int = 0
    max_per_source: int = 0
    open: int = 0
    refused: int = 0  # since the start
    _by_source: collections.Counter[str] = field(default_factory=collections.Counter)
    _logged_at: float = 0.0
    _logged_refused: int = 0

    def admit(self, source: str) -> bool:
        if (self.max_open and self.open >= self.max_open) or (
            self.max_per_source and self._by_source[source] >= self.max_per_source
        ):
            self.refused += 1
            self._say_refused(source)
            return False
        self.open += 1
        self._by_source[source] += 1
        return True

    def release(self, source: str) -> None:
        self.open -= 1
        self._by_source[source] -= 1
        if self._by_source[source] <= 0:
            del self._by_source[source]

    def held_by(self, source: str) -> int:
        return self._by_source[source]

    def _say_refused(self, source: str) -> None:
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            log.warning(
                "%s: closed %d new connections at accept (open %d of %d; %s holds %d of %d)",
                self.name,
                self.refused - self._logged_refused,
                self.open,
                self.max_open,
                source,
                self._by_source[source],
                self.max_per_source,
            )
            self._logged_at, self._logged_refused = now, self.refused


class _Held(socket.socket):
    """An accepted connection that gives its place back once, when it is closed."""

    def __init__(self, listener: socket.socket, fd: int, caps: ConnectionCaps, source: str):
        super().__init__(listener.family, listener.type, listener.proto, fileno=fd)
        self._caps: ConnectionCaps | None = caps
        self._source = source

    def close(self) -> None:
        caps, self._caps = self._caps, None
        try:
            super().close()
        finally:
            if caps is not None:
                caps.release(self._source)

    def detach(self) -> int:
        caps, self._caps = self._caps, None
        if caps is not None:  # whoever takes the descriptor owns its end; not counted after
            caps.release(self._source)
        return super().detach()


class CappedListener(socket.socket):
    """A listening socket (made from one that listens already) whose accept() keeps `caps`."""

    def __init__(self, listening: socket.socket, caps: ConnectionCaps) -> None:
        family, kind, proto = listening.family, listening.type, listening.proto
        super().__init__(family, kind, proto, fileno=listening.detach())
        self.caps = caps

    def accept(self) -> tuple[socket.socket, object]:
        """The next connection within the caps; those past them are closed unread. Raises
        BlockingIOError when none is waiting (asyncio then waits for the next), also after
        REFUSED_PER_ACCEPT refusals in a row (the rest are taken at the loop's next turn)."""
        for _ in range(REFUSED_PER_ACCEPT):
            fd, address = self._accept()  # type: ignore[attr-defined]
            source = source_of(address)
            if self.caps.admit(source):
                return _Held(self, fd, self.caps, source), address
            with contextlib.suppress(OSError):
                socket.close(fd)
        raise BlockingIOError("connections past the listener's caps, closed")


def listening(
    listen: str, setting: str, caps: ConnectionCaps, backlog: int = 1024
) -> CappedListener:
    """A socket listening on `listen` (host:port, the host maybe a bracketed IPv6 address),
    capped; ConfigError naming `setting` when it cannot be bound."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"{setting} {listen}: {exc.strerror or exc}") from None
    return CappedListener(sock, caps)
