"""The egress proxy with a session Interceptor, in-process (no Docker): a bound host is
intercepted and gets its header, an unbound one stays a plain end-to-end tunnel, an upstream
that does not verify refuses the CONNECT, a placeholder in plain HTTP is audited. Each test runs
with connections handed in by a loopback listener and through the agent's channel, static and
ASan/UBSan (the TLS interception then runs over a channel stream: tests/egress_link.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from egress_link import FRONTS, front, front_helper
from sandboxd.egress.addresses import Protected
from sandboxd.egress.audit import AuditLog
from sandboxd.egress.policy import DEFAULT_QUOTAS, ResolvedQuotas
from sandboxd.egress.proxy import EgressProxy, Rules
from sandboxd.egress.resolver import Resolver
from sandboxd.models import SecretBinding
from sandboxd.secrets.interceptor import Interceptor
from sandboxd.secrets.vault import Vault
from sandboxd.targets import MAX_HEAD_BYTES
from testcerts import CertAuthority

HOSTS = ("api.test", "plain.test", "bad.test")
PH = "sbx_secret_" + "c" * 40


@dataclasses.dataclass
class Rig:
    proxy: EgressProxy
    port: int
    heads: list[bytes]
    client: ssl.SSLContext
    upstream_ca: CertAuthority
    events: list[tuple[str, str]]
    address: tuple[str, int]
    release: asyncio.Event  # lets a `POST /stall` upstream go


@pytest.fixture(params=FRONTS)
async def rig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    helper = front_helper(request)
    ca, rogue = CertAuthority.create("up CA"), CertAuthority.create("rogue")
    good = ca.server_context(tmp_path, "api.test", "plain.test")
    bad = rogue.server_context(tmp_path, "bad.test")

    def sni(sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        if name == "bad.test":
            sock.context = bad

    good.sni_callback = sni  # type: ignore[assignment]
    heads: list[bytes] = []
    release = asyncio.Event()

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while head := await r.readuntil(b"\r\n\r\n"):
                heads.append(head)
                if head.startswith(b"POST /stall"):
                    await release.wait()  # reads no more: the body backs up to the sandbox
                    return
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            w.close()

    upstream = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=good)
    port = upstream.sockets[0].getsockname()[1]
    vault = Vault()
    binding = SecretBinding(
        name="API_KEY",
        hosts=("api.test", "bad.test"),
        header="Authorization",
        template="Bearer {secret}",
        placeholder=PH,
        sealed=vault.sealer.seal(b"real-value", "API_KEY"),
    )
    trust = ssl.create_default_context(cadata=ca.pem.decode())
    events: list[tuple[str, str]] = []
    interceptor = Interceptor("s1", "t", (binding,), False, vault, trust)
    proxy = EgressProxy(
        "s1",
        Rules(HOSTS, frozenset({port}), allow_private_networks=True),
        ResolvedQuotas.of(DEFAULT_QUOTAS),
        Resolver({h: ("127.0.0.1",) for h in HOSTS}),
        AuditLog("s1", on_secret=lambda kind: events.append(("metric", kind))),
        protected=Protected(host_addresses=frozenset, always=()),
        interceptor=interceptor,
    )
    client = ssl.create_default_context(cadata=ca.pem.decode())
    client.load_verify_locations(cadata=interceptor.ca.pem.decode())
    async with front(helper, proxy, tmp_path) as address:
        yield Rig(proxy, port, heads, client, ca, events, address, release)
    release.set()
    await proxy.close()
    upstream.close()


async def connect(x: Rig, host: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    r, w = await asyncio.open_connection(*x.address)
    w.write(f"CONNECT {host}:{x.port} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    return r, w, await r.readuntil(b"\r\n\r\n")


async def get(x: Rig, host: str, *headers: str) -> tuple[bytes, Any]:
    r, w, status = await connect(x, host)
    assert status.startswith(b"HTTP/1.1 200"), status
    await w.start_tls(x.client, server_hostname=host)
    issuer = w.get_extra_info("ssl_object").getpeercert()["issuer"]
    w.write(("\r\n".join(["GET / HTTP/1.1", f"Host: {host}", *headers]) + "\r\n\r\n").encode())
    answer = await r.readuntil(b"ok")
    w.close()
    return answer, issuer


async def test_bound_host_intercepted_and_given_its_header(rig: Rig) -> None:
    answer, issuer = await get(rig, "api.test", "Authorization: Bearer " + PH)
    assert answer.startswith(b"HTTP/1.1 200")
    assert "sandboxd session" in str(issuer)  # the session CA's leaf
    assert b"Authorization: Bearer real-value\r\n" in rig.heads[-1]
    await ended(rig)  # the connection's end is recorded once the proxy is done with it
    kinds = [(e.kind, e.secret) for e in rig.proxy.audit.events()]
    assert ("secret_injected", "API_KEY") in kinds
    finished = [e for e in rig.proxy.audit.events() if e.ended]
    assert finished and finished[-1].bytes_up > 0 and finished[-1].bytes_down > 0
    assert ("metric", "secret_injected") in rig.events


async def test_unbound_host_is_a_plain_tunnel_to_the_real_certificate(rig: Rig) -> None:
    answer, issuer = await get(rig, "plain.test", "X: " + PH)
    assert "up CA" in str(issuer)  # end to end: the upstream's own certificate
    assert PH.encode() in rig.heads[-1]  # opaque: nothing replaced, nothing seen
    assert not [e for e in rig.proxy.audit.events() if e.kind != "egress"]


async def test_upstream_that_does_not_verify_refuses_the_connect(rig: Rig) -> None:
    _, w, status = await connect(rig, "bad.test")
    w.close()
    assert status.startswith(b"HTTP/1.1 502") and b"UPSTREAM_CERT_INVALID" in status
    refused = [e for e in rig.proxy.audit.events() if not e.allowed]
    assert refused[-1].reason == "UPSTREAM_CERT_INVALID" and refused[-1].host == "bad.test"
    assert rig.heads == []


@pytest.mark.parametrize("refuse", [False, True])
async def test_placeholder_in_plain_http_audited_or_refused(rig: Rig, refuse: bool) -> None:
    assert rig.proxy.interceptor is not None
    rig.proxy.interceptor.update(rig.proxy.interceptor.view().bindings, refuse)
    r, w = await asyncio.open_connection(*rig.address)
    w.write(f"GET http://api.test:{rig.port}/ HTTP/1.1\r\nX-K: {PH}\r\n\r\n".encode())
    head = await r.read(4096)
    w.close()
    mis = [e for e in rig.proxy.audit.events() if e.kind == "secret_misdirected"]
    assert [(e.host, e.secret) for e in mis] == [("api.test", "API_KEY")]
    if refuse:
        assert head.startswith(b"HTTP/1.1 403") and b"SECRET_MISDIRECTED" in head
    else:
        assert not head.startswith(b"HTTP/1.1 403")  # relayed (to a TLS port: it fails there)


async def intercepted(x: Rig) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w, status = await connect(x, "api.test")
    assert status.startswith(b"HTTP/1.1 200"), status
    await w.start_tls(x.client, server_hostname="api.test")
    return r, w


async def ended(x: Rig) -> list[str]:
    """The `ended` of each finished connection (once the proxy has recorded them all)."""
    deadline = time.monotonic() + 10  # a bound for a loaded machine, not a timing claim
    while x.proxy.active and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return [e.ended for e in x.proxy.audit.events() if e.ended]


async def test_intercepted_head_over_the_limit_cuts_the_connection(rig: Rig) -> None:
    """The terminated side reads more at a time than a plain one, but a sandbox's head is
    still held to MAX_HEAD_BYTES: cut as malformed, nothing sent upstream."""
    r, w = await intercepted(rig)
    w.write(b"GET / HTTP/1.1\r\nHost: api.test\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n")
    assert await r.read(4096) == b""
    w.close()
    assert await ended(rig) == ["reset"]
    assert rig.heads == []


async def test_intercepted_chunk_line_over_the_limit_cuts_the_connection(rig: Rig) -> None:
    """A chunk-size line longer than a head ends the connection as malformed ("reset" in the
    audit), not as an error of the proxy's own task."""
    r, w = await intercepted(rig)
    w.write(
        b"POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"5;ext=" + b"x" * MAX_HEAD_BYTES + b"\r\nhello\r\n0\r\n\r\n"
    )  # fmt: skip
    await w.drain()
    assert await r.read(4096) == b""  # cut, no answer relayed
    w.close()
    assert await ended(rig) == ["reset"]


async def test_intercepted_upload_to_a_stalled_upstream_is_held_back(rig: Rig) -> None:
    """The terminated side keeps asyncio's flow control: with an upstream that reads nothing,
    the sandbox's writes stall, and the proxy holds a bounded amount, not the upload."""
    total, block = 48 * 1024 * 1024, b"z" * (1024 * 1024)
    r, w = await intercepted(rig)
    w.write(b"POST /stall HTTP/1.1\r\nHost: api.test\r\nContent-Length: %d\r\n\r\n" % total)
    tracing = tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        sent = 0
        while sent < total:
            w.write(block)
            try:
                async with asyncio.timeout(0.5):
                    await w.drain()
            except TimeoutError:
                break
            sent += len(block)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not tracing:
            tracemalloc.stop()
    w.close()
    assert sent < total  # the sandbox was held back
    assert peak - start < 16 * 1024 * 1024, (sent, peak - start)
