"""What the egress proxies of different sessions share: the resolver's lookup threads. One
tenant's sessions together hold at most their share of them (half), however many sessions
it runs, so another tenant's lookups always have a thread (a black-hole resolver stands for
a name server that never answers). The proxy is fed connections directly (`accept`), as the
agent's channel hands them over."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sandboxd.egress.audit import AuditLog
from sandboxd.egress.policy import DEFAULT_QUOTAS, ResolvedQuotas
from sandboxd.egress.proxy import EgressProxy, Rules
from sandboxd.egress.resolver import Resolver


@pytest.fixture
def black_hole(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    release = threading.Event()

    def hang(*args: Any, **kwargs: Any) -> list[Any]:
        release.wait(30)
        raise socket.gaierror(socket.EAI_AGAIN, "black hole")

    monkeypatch.setattr(socket, "getaddrinfo", hang)
    yield release
    release.set()


def _proxy(session_id: str, tenant: str, resolver: Resolver) -> EgressProxy:
    return EgressProxy(
        session_id,
        Rules(domains=("*.test",), ports=frozenset({443}), allow_private_networks=False),
        dataclasses.replace(ResolvedQuotas.of(DEFAULT_QUOTAS), max_dns_lookups=8),
        resolver,
        AuditLog(session_id),
        tenant=tenant,
    )


async def _connect_via(proxy: EgressProxy, name: str) -> str:
    """A CONNECT through `proxy`; the refusal reason it answers."""
    server = await asyncio.start_server(
        lambda r, w: proxy.accept(r, w), "127.0.0.1", 0, limit=proxy.read_limit
    )
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"CONNECT {name}:443 HTTP/1.1\r\nHost: {name}:443\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        writer.close()
        return next(
            line.split(b": ", 1)[1].decode()
            for line in head.split(b"\r\n")
            if line.startswith(b"X-Sandboxd-Egress-Reason")
        )
    finally:
        server.close()


async def test_one_tenants_sessions_share_one_share_of_the_lookup_threads(
    black_hole: threading.Event,
) -> None:
    resolver = Resolver(threads=4, timeout_s=0.2)
    hog = [_proxy(f"hog-{i}", "hog", resolver) for i in range(4)]
    other = _proxy("other-1", "other", resolver)
    try:
        reasons = [await _connect_via(p, f"stuck{i}.test") for i, p in enumerate(hog)]
        # two lookups of the tenant are stuck (its half); its other sessions' are refused
        assert reasons == ["DNS_FAILED", "DNS_FAILED", "QUOTA_DNS", "QUOTA_DNS"]
        assert await _connect_via(other, "other.test") == "DNS_FAILED"  # a thread was free
    finally:
        black_hole.set()
        for p in [*hog, other]:
            await p.close()
        resolver.close()
