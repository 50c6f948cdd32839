"""The egress proxy in-process (no Docker): the decision order, refusals that never dial,
quotas, plain-HTTP rewriting, and the audit record. Every test runs over each front: connections
handed to the proxy by a loopback listener of the test's own, and the real path of a sandbox's
connection: the agent (`sbx agent`, a child process over pipes, static and ASan/UBSan) accepts it
on its loopback listener and carries it as an `egress` stream over the server's Channel to the
proxy."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from egress_link import FRONTS, front, front_helper
from sandboxd.egress.addresses import Protected
from sandboxd.egress.audit import AuditLog
from sandboxd.egress.policy import DEFAULT_QUOTAS, ResolvedQuotas
from sandboxd.egress.proxy import EgressProxy, Rules
from sandboxd.egress.resolver import Resolver

# The upstreams of these tests listen on loopback, which the server's proxy never dials
# (tests/unit/test_egress_addresses.py); here only the proxy's mechanics are under test.
LOOPBACK_UPSTREAMS = Protected(host_addresses=frozenset, always=())

_FRONT: dict[str, Any] = {"helper": None, "tmp": Path("/nonexistent")}
_ADDRESS: dict[int, tuple[str, int]] = {}


@pytest.fixture(autouse=True, params=FRONTS)
def connections_via(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """How this test's connections reach the proxy."""
    _FRONT.update(helper=front_helper(request), tmp=tmp_path)
    yield str(request.param)


@contextlib.asynccontextmanager
async def serving(proxy: EgressProxy) -> AsyncIterator[EgressProxy]:
    async with front(_FRONT["helper"], proxy, _FRONT["tmp"]) as address:
        _ADDRESS[id(proxy)] = address
        try:
            yield proxy
        finally:
            _ADDRESS.pop(id(proxy), None)
            await proxy.close()


def address(proxy: EgressProxy) -> tuple[str, int]:
    return _ADDRESS[id(proxy)]


class Upstream:
    """A loopback listener that records every connection; echoes, or answers HTTP once."""

    def __init__(self, mode: str = "echo") -> None:
        self.mode = mode
        self.connections = 0
        self.received = bytearray()
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Upstream:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            if self.mode == "http":
                head = await r.readuntil(b"\r\n\r\n")
                self.received += head
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if length:
                    self.received += await r.readexactly(length)
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
                await w.drain()
            else:
                while data := await r.read(65536):
                    self.received += data
                    w.write(data)
                    await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()


def quotas(**changes: object) -> ResolvedQuotas:
    return dataclasses.replace(ResolvedQuotas.of(DEFAULT_QUOTAS), **changes)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def proxy_for(
    port: int,
    *,
    private: bool = True,
    hosts: dict[str, tuple[str, ...]] | None = None,
    **quota_changes: object,
) -> AsyncIterator[EgressProxy]:
    static = {"up.test": ("127.0.0.1",), "meta.test": ("169.254.169.254",)}
    static.update(hosts or {})
    proxy = EgressProxy(
        "s-test",
        Rules(
            domains=("up.test", "*.wild.test", "meta.test", "mixed.test", "ten.test"),
            ports=frozenset({port}),
            allow_private_networks=private,
        ),
        quotas(**quota_changes),
        Resolver(static),
        AuditLog("s-test"),
        protected=LOOPBACK_UPSTREAMS,
    )
    async with serving(proxy):
        yield proxy


async def ask(
    proxy: EgressProxy, head: bytes
) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_connection(*address(proxy))
    w.write(head)
    await w.drain()
    status = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
    return status, r, w


async def refused(proxy: EgressProxy, head: bytes) -> tuple[int, str]:
    status, r, w = await ask(proxy, head)
    rest = await asyncio.wait_for(r.read(), 5)  # the proxy closes after a refusal
    w.close()
    code = int(status.split(b" ")[1])
    reason = next(
        line.split(b": ")[1].decode()
        for line in status.split(b"\r\n")
        if line.startswith(b"X-Sandboxd-Egress-Reason")
    )
    assert rest.startswith(b"sandboxd egress proxy")
    return code, reason


async def test_connect_tunnel_and_audit() -> None:
    async with Upstream() as up, proxy_for(up.port) as proxy:
        status, r, w = await ask(proxy, f"CONNECT UP.test.:{up.port} HTTP/1.1\r\n\r\n".encode())
        assert status.startswith(b"HTTP/1.1 200")
        w.write(b"ping")
        await w.drain()
        assert await r.readexactly(4) == b"ping"
        w.close()
        for _ in range(50):
            if proxy.audit.events():
                break
            await asyncio.sleep(0.05)
        (event,) = proxy.audit.events()
        assert (event.allowed, event.host, event.address) == (True, "up.test", "127.0.0.1")
        assert (event.bytes_up, event.bytes_down) == (4, 4)


async def test_plain_http_is_rewritten() -> None:
    async with Upstream("http") as up, proxy_for(up.port) as proxy:
        head = (
            f"POST http://up.test:{up.port}/x HTTP/1.1\r\nHost: other\r\n"
            "Proxy-Authorization: secret\r\nContent-Length: 3\r\n\r\nabc"
        ).encode()
        status, r, w = await ask(proxy, head)
        assert status.startswith(b"HTTP/1.1 200 OK")
        assert await r.read() == b"hello"
        w.close()
        assert b"POST /x HTTP/1.1\r\n" in up.received
        assert f"Host: up.test:{up.port}\r\n".encode() in up.received
        assert b"secret" not in up.received and b"other" not in up.received
        assert up.received.endswith(b"\r\n\r\nabc")


@pytest.mark.parametrize(
    ("target", "code", "reason"),
    [
        ("other.test:{port}", 403, "NAME_NOT_ALLOWED"),
        ("wild.test:{port}", 403, "NAME_NOT_ALLOWED"),
        ("up.test:1", 403, "PORT_NOT_ALLOWED"),
        ("127.0.0.1:{port}", 403, "IP_LITERAL"),
        ("127.1:{port}", 403, "IP_LITERAL"),
        ("2130706433:{port}", 403, "IP_LITERAL"),
        ("[::1]:{port}", 403, "IP_LITERAL"),
        ("up.test:0{port}", 400, "INVALID_PORT"),
    ],
)
async def test_refusals_never_dial(target: str, code: int, reason: str) -> None:
    async with Upstream() as up, proxy_for(up.port) as proxy:
        head = f"CONNECT {target.format(port=up.port)} HTTP/1.1\r\n\r\n".encode()
        assert await refused(proxy, head) == (code, reason)
        assert up.connections == 0
        assert proxy.audit.events()[-1].reason == reason


async def test_private_answers_refused_without_opt_in() -> None:
    async with (
        Upstream() as up,
        proxy_for(
            up.port,
            private=False,
            hosts={"mixed.test": ("8.8.8.8", "10.0.0.1"), "ten.test": ("::ffff:10.0.0.1",)},
        ) as proxy,
    ):
        for name in ("up.test", "meta.test", "mixed.test", "ten.test"):
            head = f"CONNECT {name}:{up.port} HTTP/1.1\r\n\r\n".encode()
            assert await refused(proxy, head) == (403, "ADDRESS_REFUSED"), name
        assert up.connections == 0
        assert proxy.audit.events()[1].address == "169.254.169.254"


async def test_malformed_and_slow_heads() -> None:
    async with Upstream() as up, proxy_for(up.port, header_timeout_s=0.3) as proxy:
        bare_lf = b"CONNECT up.test:80 HTTP/1.1\r\nA: b\nC: d\r\n\r\n"
        assert (await refused(proxy, bare_lf))[1] == "MALFORMED_REQUEST"
        r, w = await asyncio.open_connection(*address(proxy))
        w.write(b"CONNECT up.test")
        status = await asyncio.wait_for(r.read(), 5)
        assert status.startswith(b"HTTP/1.1 408") and b"HEADER_TIMEOUT" in status
        w.close()
        r, w = await asyncio.open_connection(*address(proxy))
        w.write(b"CONNECT up.test:1 HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")
        status = await asyncio.wait_for(r.read(), 5)
        assert status.startswith(b"HTTP/1.1 431")
        w.close()
        assert up.connections == 0


async def test_connection_quota_leaves_open_tunnels_alone() -> None:
    async with Upstream() as up, proxy_for(up.port, max_connections=1) as proxy:
        status, r, w = await ask(proxy, f"CONNECT up.test:{up.port} HTTP/1.1\r\n\r\n".encode())
        assert status.startswith(b"HTTP/1.1 200")
        r2, w2 = await asyncio.open_connection(*address(proxy))
        second = await asyncio.wait_for(r2.read(), 5)
        assert second.startswith(b"HTTP/1.1 429") and b"QUOTA_CONNECTIONS" in second
        w2.close()
        w.write(b"still")  # the first tunnel is unaffected
        await w.drain()
        assert await r.readexactly(5) == b"still"
        w.close()


async def test_request_and_byte_quotas() -> None:
    async with Upstream() as up, proxy_for(up.port, max_requests=1, max_bytes_up=10) as proxy:
        status, r, w = await ask(proxy, f"CONNECT up.test:{up.port} HTTP/1.1\r\n\r\n".encode())
        w.write(b"0123456789abcdef")  # over the 10-byte budget: the tunnel is cut
        await w.drain()
        got = await asyncio.wait_for(r.read(), 5)  # ends: the tunnel was cut
        assert len(got) <= 10 and len(up.received) == 10
        w.close()
        code, reason = await refused(proxy, f"CONNECT up.test:{up.port} HTTP/1.1\r\n\r\n".encode())
        assert (code, reason) == (429, "QUOTA_REQUESTS")
        ended = [e.ended for e in proxy.audit.events() if e.allowed]
        assert ended == ["byte_quota"]


async def test_idle_timeout_and_lifetime() -> None:
    async with Upstream() as up, proxy_for(up.port, idle_timeout_s=0.3) as proxy:
        _, r, w = await ask(proxy, f"CONNECT up.test:{up.port} HTTP/1.1\r\n\r\n".encode())
        assert await asyncio.wait_for(r.read(), 5) == b""  # closed when idle
        w.close()
    async with Upstream() as up, proxy_for(up.port, tunnel_lifetime_s=0.5) as proxy:
        _, r, w = await ask(proxy, f"CONNECT up.test:{up.port} HTTP/1.1\r\n\r\n".encode())
        for _ in range(20):
            w.write(b"x")
            with contextlib.suppress(ConnectionError):
                await w.drain()
            if not await asyncio.wait_for(r.read(1), 5):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the tunnel outlived its lifetime")
        w.close()


async def test_rules_update_applies_to_new_connections() -> None:
    async with Upstream() as up, proxy_for(up.port) as proxy:
        status, r, w = await ask(proxy, f"CONNECT up.test:{up.port} HTTP/1.1\r\n\r\n".encode())
        assert status.startswith(b"HTTP/1.1 200")
        proxy.rules = dataclasses.replace(proxy.rules, domains=("other.test",))
        code, reason = await refused(proxy, f"CONNECT up.test:{up.port} HTTP/1.1\r\n\r\n".encode())
        assert (code, reason) == (403, "NAME_NOT_ALLOWED")
        w.write(b"open")
        await w.drain()
        assert await r.readexactly(4) == b"open"
        w.close()


async def test_unreachable_upstream_is_a_502() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    async with proxy_for(port) as proxy:
        code, reason = await refused(proxy, f"CONNECT up.test:{port} HTTP/1.1\r\n\r\n".encode())
        assert (code, reason) == (502, "UPSTREAM_UNREACHABLE")
        assert proxy.audit.events()[-1].address == "127.0.0.1"


async def test_static_map_names_are_normalized_like_requests() -> None:
    async with Upstream() as up, proxy_for(up.port) as proxy:
        status, _, w = await ask(proxy, f"CONNECT Up.Test.:{up.port} HTTP/1.1\r\n\r\n".encode())
        assert status.startswith(b"HTTP/1.1 200")
        w.close()


class SlowResolver(Resolver):
    """Answers after a pause, so lookups pile up."""

    async def resolve(self, name: str, port: int, *, owner: str = "") -> list[str]:
        await asyncio.sleep(0.5)
        return ["127.0.0.1"]


async def test_dns_quota() -> None:
    async with Upstream() as up:
        proxy = EgressProxy(
            "s-test",
            Rules(("up.test",), frozenset({up.port}), allow_private_networks=True),
            quotas(max_dns_lookups=1),
            SlowResolver(),
            AuditLog("s-test"),
            protected=LOOPBACK_UPSTREAMS,
        )
        async with serving(proxy):
            head = f"CONNECT up.test:{up.port} HTTP/1.1\r\n\r\n".encode()
            first = asyncio.create_task(ask(proxy, head))
            await asyncio.sleep(0.1)  # the first lookup is in flight
            assert await refused(proxy, head) == (429, "QUOTA_DNS")
            status, _, w = await first
            assert status.startswith(b"HTTP/1.1 200")  # the first one was not affected
            w.close()
