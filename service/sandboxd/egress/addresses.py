"""Which IP addresses the proxy may dial: an explicit classifier (pure, table-tested).

`ipaddress.is_global` alone is wrong for several ranges (multicast, NAT64, 6to4), so every
refused range is listed here with the reason a caller sees. IPv6 forms that embed an IPv4
address are judged by that address; the rest of IPv6 is allowed only inside 2000::/3, minus
the protocol and documentation blocks.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

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


def check(addr: IPAddress, *, allow_private_networks: bool) -> Verdict:
    """The proxy's check: a zone id is refused always; the rest unless private networks are on."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id:
        return Verdict(False, f"{addr} carries a zone id")
    if allow_private_networks:
        return ALLOWED
    return classify(addr)


def parse_answer(text: str) -> IPAddress:
    """An address from a resolver answer (getaddrinfo or the static map); ValueError if not one."""
    return ipaddress.ip_address(text)
