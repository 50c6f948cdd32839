"""Table tests of the egress address classifier: every range SECURITY.md lists, both ways."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from sandboxd.egress.addresses import Protected, check, classify, local_addresses

NO_HOST = Protected(host_addresses=frozenset)  # a host with no addresses: only ranges count

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


@pytest.mark.parametrize("text", ["10.0.0.1", "172.16.5.4", "192.168.1.1", "fd00::1"])
def test_private_networks_opt_in(text: str) -> None:
    addr = ipaddress.ip_address(text)
    assert not check(addr, allow_private_networks=False, protected=NO_HOST).allowed
    assert check(addr, allow_private_networks=True, protected=NO_HOST).allowed


@pytest.mark.parametrize(
    "text",
    [
        "127.0.0.1",
        "127.1.2.3",
        "::1",
        "::ffff:127.0.0.1",
        "::127.0.0.1",
        "64:ff9b::7f00:1",
        "0.0.0.0",
        "::",
        "169.254.169.254",
        "::ffff:169.254.169.254",
        "168.63.129.16",
        "::ffff:168.63.129.16",
        "100.100.100.200",
        "fd00:ec2::254",
        "fe80::1",
        "224.0.0.1",
        "255.255.255.255",
    ],
)
def test_host_and_metadata_refused_whatever_the_grant(text: str) -> None:
    """A private-networks grant opens the LAN, never this host or cloud metadata."""
    addr = ipaddress.ip_address(text)
    verdict = check(addr, allow_private_networks=True, protected=NO_HOST)
    assert not verdict.allowed and "whatever the grant" in verdict.reason
    assert not check(addr, allow_private_networks=False, protected=NO_HOST).allowed


def test_host_addresses_and_listeners_refused_whatever_the_grant() -> None:
    lan = ipaddress.ip_address("192.168.7.7")  # say, this host's LAN address
    engine = ipaddress.ip_address("10.9.9.9")  # a tcp:// engine on another host
    protected = Protected.of(["10.9.9.9", "0.0.0.0", "localhost", "[::]"])
    protected.host_addresses = lambda: frozenset({lan, ipaddress.ip_address("2001:db9::5")})
    for addr in (lan, engine, ipaddress.ip_address("::ffff:192.168.7.7")):
        assert not check(addr, allow_private_networks=True, protected=protected).allowed
    # a public address of this host too: global unicast is no excuse
    public = ipaddress.ip_address("2001:db9::5")
    assert not check(public, allow_private_networks=False, protected=protected).allowed
    other = ipaddress.ip_address("192.168.7.8")
    assert check(other, allow_private_networks=True, protected=protected).allowed


def test_host_addresses_are_read_live_and_cached_briefly() -> None:
    calls: list[int] = []
    new = ipaddress.ip_address("10.1.2.3")

    def read() -> frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        calls.append(1)
        return frozenset({new}) if len(calls) > 1 else frozenset()

    protected = Protected(host_addresses=read, ttl_s=3600)
    assert check(new, allow_private_networks=True, protected=protected).allowed
    protected.refresh()  # the server added a session network: its gateway is the host's now
    assert not check(new, allow_private_networks=True, protected=protected).allowed


def test_local_addresses_parse_the_kernel_tables(tmp_path: Path) -> None:
    (tmp_path / "fib_trie").write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n"
        "     |-- 192.168.7.7\n        /32 host LOCAL\n     |-- 192.168.7.255\n"
        "        /32 link BROADCAST\nLocal:\n     |-- 127.0.0.1\n        /32 host LOCAL\n"
    )
    (tmp_path / "if_inet6").write_text(
        "00000000000000000000000000000001 01 80 10 80       lo\n"
        "fd000000000000000000000000000002 02 40 00 80     eth0\n"
    )
    assert local_addresses(tmp_path) == {
        ipaddress.ip_address(a) for a in ("192.168.7.7", "127.0.0.1", "::1", "fd00::2")
    }
    assert ipaddress.ip_address("127.0.0.1") in local_addresses()  # this machine's, live


def test_zone_ids_refused_even_with_private_networks() -> None:
    addr = ipaddress.ip_address("fe80::1%eth0")
    assert not check(addr, allow_private_networks=True).allowed
    assert not check(addr, allow_private_networks=False).allowed


def test_the_server_protects_its_listeners_and_a_tcp_engine() -> None:
    import asyncio

    from sandboxd.config import Config
    from sandboxd.server.parts import _protected

    config = Config(
        listen="10.1.1.1:50051", metrics_listen="10.1.1.2:9464", docker_host="tcp://10.9.9.9:2375"
    )
    protected = asyncio.run(_protected(config))
    protected.host_addresses = frozenset  # only what the configuration names
    for text in ("10.1.1.1", "10.1.1.2", "10.9.9.9", "::ffff:10.9.9.9"):
        verdict = check(
            ipaddress.ip_address(text), allow_private_networks=True, protected=protected
        )
        assert not verdict.allowed, text
    other = ipaddress.ip_address("10.1.1.3")
    assert check(other, allow_private_networks=True, protected=protected).allowed
