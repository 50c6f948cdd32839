"""Table tests of the egress address classifier: every range SECURITY.md lists, both ways."""

from __future__ import annotations

import ipaddress

import pytest
from sandboxd.egress.addresses import check, classify

REFUSED = [
    # IPv4: every listed range, at its edges
    "0.0.0.0",
    "0.255.255.255",
    "10.0.0.1",
    "10.255.255.255",
    "100.64.0.1",
    "100.127.255.255",
    "127.0.0.1",
    "127.255.255.254",
    "169.254.169.254",
    "169.254.0.1",
    "172.16.0.1",
    "172.31.255.255",
    "192.0.0.8",
    "192.0.2.1",
    "192.88.99.1",
    "192.168.1.1",
    "198.18.0.1",
    "198.19.255.255",
    "198.51.100.7",
    "203.0.113.9",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    # IPv6: listed blocks
    "::",
    "::1",
    "fc00::1",
    "fd12:3456::1",
    "fe80::1",
    "febf::1",
    "fec0::1",
    "ff02::1",
    "ff0e::1",
    "100::1",
    "2001:db8::1",
    "3fff::1",
    "3fff:fff::1",
    "2001::1",  # Teredo
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo with a global server
    "2001:1ff::1",  # 2001::/23
    "2002:c000:0204::1",  # 6to4 (of 192.0.2.4)
    "2002:0808:0808::1",  # 6to4 of a global address: refused by the simple rule
    # embedded IPv4, judged by the address they carry
    "::ffff:127.0.0.1",
    "::ffff:7f00:1",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "::ffff:0.0.0.0",
    "::127.0.0.1",  # IPv4-compatible
    "::8.8.8.8",  # IPv4-compatible: refused whatever it embeds
    "64:ff9b::127.0.0.1",  # NAT64
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b::10.1.2.3",
    "64:ff9b:1::8.8.8.8",  # local-use NAT64
    # outside 2000::/3
    "4000::1",
    "8000::1",
    "e000::1",
]

ALLOWED = [
    "1.1.1.1",
    "8.8.8.8",
    "100.63.255.255",
    "100.128.0.1",
    "172.15.255.255",
    "172.32.0.1",
    "169.253.255.255",
    "192.0.1.255",
    "198.17.255.255",
    "198.20.0.1",
    "223.255.255.255",
    "2606:4700:4700::1111",
    "2a00:1450:4001::1",
    "2001:200::1",  # just past 2001::/23
    "3ffe::1",  # just below 3fff::/20
    "::ffff:8.8.8.8",  # mapped global
    "64:ff9b::8.8.8.8",  # NAT64 of a global address
]


@pytest.mark.parametrize("text", REFUSED)
def test_refused(text: str) -> None:
    verdict = classify(ipaddress.ip_address(text))
    assert not verdict.allowed, text
    assert verdict.reason


@pytest.mark.parametrize("text", ALLOWED)
def test_allowed(text: str) -> None:
    assert classify(ipaddress.ip_address(text)).allowed, text


def test_is_global_alone_would_be_wrong() -> None:
    # why the explicit list: ipaddress calls these global, the proxy must not
    for text in ("ff0e::1", "2002:0a00:0001::1"):
        addr = ipaddress.ip_address(text)
        assert not classify(addr).allowed


def test_embedded_reason_names_the_ipv4_address() -> None:
    verdict = classify(ipaddress.ip_address("::ffff:a9fe:a9fe"))
    assert "169.254.169.254" in verdict.reason


@pytest.mark.parametrize("text", ["10.0.0.1", "127.0.0.1", "::1", "fd00::1"])
def test_private_networks_opt_in(text: str) -> None:
    addr = ipaddress.ip_address(text)
    assert not check(addr, allow_private_networks=False).allowed
    assert check(addr, allow_private_networks=True).allowed


def test_zone_ids_refused_even_with_private_networks() -> None:
    addr = ipaddress.ip_address("fe80::1%eth0")
    assert not check(addr, allow_private_networks=True).allowed
    assert not check(addr, allow_private_networks=False).allowed
