"""Which IP addresses the proxy may dial: an explicit classifier (pure, table-tested).

`ipaddress.is_global` alone is wrong for several ranges (multicast, NAT64, 6to4), so every
refused range is listed here with the reason a caller sees. IPv6 forms that embed an IPv4
address are judged by that address; the rest of IPv6 is allowed only inside 2000::/3, minus
the protocol and documentation blocks.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

REFUSED_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/8"), "this network"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "shared address space (CGNAT)"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local (cloud metadata)"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "IETF protocol assignments"),
    (_V4("192.0.2.0/24"), "documentation"),
    (_V4("192.88.99.0/24"), "6to4 relay anycast"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("198.18.0.0/15"), "benchmarking"),
    (_V4("198.51.100.0/24"), "documentation"),
    (_V4("203.0.113.0/24"), "documentation"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved (and broadcast)"),
)

# Checked in order: the embedded-IPv4 forms first, then the listed blocks, then 2000::/3.
_MAPPED = _V6("::ffff:0:0/96")
_COMPAT = _V6("::/96")
_NAT64 = _V6("64:ff9b::/96")
_NAT64_LOCAL = _V6("64:ff9b:1::/48")
_SIXTOFOUR = _V6("2002::/16")
_TEREDO = _V6("2001::/32")
_GLOBAL_UNICAST = _V6("2000::/3")

REFUSED_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("fc00::/7"), "unique local"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fec0::/10"), "site-local"),
    (_V6("ff00::/8"), "multicast"),
    (_V6("100::/64"), "discard-only"),
    (_V6("2001:db8::/32"), "documentation"),
    (_V6("3fff::/20"), "documentation"),
    (_NAT64_LOCAL, "local-use NAT64"),
    (_TEREDO, "Teredo"),
    (_V6("2001::/23"), "IETF protocol assignments"),
    (_SIXTOFOUR, "6to4"),
)


@dataclass(frozen=True)
class Verdict:
    """Whether an address may be dialled; `reason` says why not (empty when allowed)."""

    allowed: bool
    reason: str = ""


ALLOWED = Verdict(True)


def _v4(addr: ipaddress.IPv4Address) -> Verdict:
    for net, why in REFUSED_V4:
        if addr in net:
            return Verdict(False, f"{addr} is {why} ({net})")
    return ALLOWED


def _embedded(addr: ipaddress.IPv6Address, what: str) -> Verdict:
    inner = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    verdict = _v4(inner)
    if verdict.allowed:
        return verdict
    return Verdict(False, f"{addr} is {what} of {inner}: {verdict.reason}")


def classify(addr: IPAddress) -> Verdict:
    """The verdict for one address when private networks are not allowed."""
    if isinstance(addr, ipaddress.IPv4Address):
        return _v4(addr)
    if addr.scope_id:
        return Verdict(False, f"{addr} carries a zone id")
    if addr in _MAPPED:
        return _embedded(addr, "IPv4-mapped")
    if addr in _NAT64:
        return _embedded(addr, "NAT64")
    for net, why in REFUSED_V6:
        if addr in net:
            return Verdict(False, f"{addr} is {why} ({net})")
    if addr in _COMPAT:
        # Deprecated IPv4-compatible form: refused whatever it embeds (stricter than needed).
        return Verdict(False, f"{addr} is IPv4-compatible IPv6 (::/96)")
    if addr not in _GLOBAL_UNICAST:
        return Verdict(False, f"{addr} is outside global unicast 2000::/3")
    return ALLOWED


# Refused whatever the grant: this host itself, cloud metadata and wire servers, and what no
# connect should ever aim at. (A private-networks grant opens the LAN, never the host.)
ALWAYS_REFUSED: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = (
    (_V4("0.0.0.0/8"), "this network"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local (cloud metadata)"),
    (_V4("168.63.129.16/32"), "a cloud wire server"),
    (_V4("100.100.100.200/32"), "cloud metadata"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved (and broadcast)"),
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fd00:ec2::254/128"), "cloud metadata"),
    (_V6("ff00::/8"), "multicast"),
)


def _embedded_v4(addr: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form would reach (mapped, compatible, NAT64)."""
    if isinstance(addr, ipaddress.IPv6Address) and (
        addr in _MAPPED or addr in _COMPAT or addr in _NAT64
    ):
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def local_addresses(proc: Path = Path("/proc/net")) -> frozenset[IPAddress]:
    """Every address of this host's interfaces (Linux: the kernel's local routes)."""
    found: set[IPAddress] = set()
    last = ""
    for line in _read(proc / "fib_trie").splitlines():
        text = line.strip()
        if text.startswith(("|--", "+--")):
            last = text[3:].strip().split(" ")[0]
        elif text == "/32 host LOCAL" and last:
            try:
                found.add(ipaddress.IPv4Address(last))
            except ValueError:
                pass
    for line in _read(proc / "if_inet6").splitlines():
        hexaddr = line.split(" ")[0]
        try:
            found.add(ipaddress.IPv6Address(int(hexaddr, 16)))
        except ValueError:
            pass
    return frozenset(found)


@dataclass
class Protected:
    """What no grant opens: fixed addresses (the engine's, the listeners') and the host's own.

    The host's addresses are read live (interfaces come and go), cached for `ttl_s`;
    `refresh()` drops the cache.
    """

    addresses: frozenset[IPAddress] = frozenset()
    host_addresses: Callable[[], frozenset[IPAddress]] = local_addresses
    ttl_s: float = 1.0
    # The server always keeps these; in-process tests of the proxy's mechanics, whose
    # upstreams can only listen on loopback, pass none.
    always: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = ALWAYS_REFUSED
    _cache: frozenset[IPAddress] = field(default=frozenset(), repr=False)
    _read_at: float = field(default=float("-inf"), repr=False)

    @classmethod
    def of(cls, texts: Iterable[str]) -> Protected:
        """From host texts (listen hosts, the engine host); names and wildcards are skipped:
        a wildcard listener is on the host's own addresses, refused anyway."""
        found: set[IPAddress] = set()
        for text in texts:
            try:
                found.add(ipaddress.ip_address(text.strip("[]")))
            except ValueError:
                continue
        return cls(frozenset(found))

    def refresh(self) -> None:
        self._read_at = float("-inf")

    def host(self) -> frozenset[IPAddress]:
        now = time.monotonic()
        if now - self._read_at > self.ttl_s:
            self._cache = self.host_addresses()
            self._read_at = now
        return self._cache

    def verdict(self, addr: IPAddress) -> Verdict:
        candidates = [addr] + [a for a in (_embedded_v4(addr),) if a is not None]
        for a in candidates:
            for net, why in self.always:
                if a in net:
                    return Verdict(False, f"{addr} is {why} ({net}), refused whatever the grant")
            if a in self.addresses or a in self.host():
                return Verdict(False, f"{addr} is this server's host, refused whatever the grant")
        return ALLOWED


def check(
    addr: IPAddress, *, allow_private_networks: bool, protected: Protected | None = None
) -> Verdict:
    """The proxy's check: a zone id, the host and metadata always refused; the rest unless
    private networks are granted and asked for."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id:
        return Verdict(False, f"{addr} carries a zone id")
    verdict = (protected or _NOTHING_FIXED).verdict(addr)
    if not verdict.allowed:
        return verdict
    if allow_private_networks:
        return ALLOWED
    return classify(addr)


_NOTHING_FIXED = Protected()


def parse_answer(text: str) -> IPAddress:
    """An address from a resolver answer (getaddrinfo or the static map); ValueError if not one."""
    return ipaddress.ip_address(text)
