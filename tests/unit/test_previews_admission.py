"""A shared preview listener is not a shared failure: idle half-requests are closed by the
head's timeout, pending connections have a pool and a per-source cap of their own, and
admitted ones count against their tenant. Sources are loopback addresses of their own
(127.0.0.N: Linux routes all of 127/8 to lo), so one test can be several hosts."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from authutil import Pki
from preview_world import World, backend, close, listener_port, req, world
from sandboxd import tenancy
from sandboxd.listener_caps import source_of
from sandboxd.previews.admission import Admission, Full
from sandboxd.previews.publishing import Preview
from sandboxd.sessions import CreateSessionInput

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _tenant_preview(w: World, tenant: str, port: int = 8080) -> Preview:
    async def run() -> Preview:
        tenancy.use_tenant(tenant, tenancy.TenantGrants())
        await w.sessions.create(CreateSessionInput(session_id=f"{tenant}.s"))
        return await w.previews.publish(f"{tenant}.s", port, None, False)

    return await asyncio.create_task(run())


async def _ok(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
    while True:
        try:
            await r.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return
        wr.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await wr.drain()


async def _connect(url: str, source: str, data: bytes = b"") -> Conn:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", listener_port(url), local_addr=(source, 0)
    )
    if data:
        writer.write(data)
        await writer.drain()
    return reader, writer


HALF = b"GET /preview/alice.s/8080/ HTTP/1.1\r\nHost: x\r\n"  # no blank line, no token


async def _ended(conn: Conn, within: float = 10) -> bytes:
    """What the listener sent before it closed the connection (TimeoutError if it did not)."""
    try:
        return await asyncio.wait_for(conn[0].read(), within)
    except ConnectionResetError:
        return b"(reset)"


async def _still_open(conn: Conn) -> bool:
    try:
        await asyncio.wait_for(conn[0].read(1), 0.2)
    except TimeoutError:
        return True
    except ConnectionError:
        return False
    return False


async def test_idle_half_requests_of_one_source_leave_others_served(tmp_path: Path) -> None:
    """Twelve idle half-requests from one source, past its cap of 4 and the listener's 8
    connections: the source's extra ones are refused at once, and a valid request from
    another source is answered while the idle ones are still held."""
    settings = {
        "preview_max_clients": 8,
        "preview_max_pending_per_source": 4,
        "preview_head_timeout": 60.0,
    }
    async with world(tmp_path, **settings) as w:
        p = await _tenant_preview(w, "alice")
        await backend(w, 8080, _ok)
        idle = [await _connect(p.path_url, "127.0.0.1", HALF) for _ in range(12)]
        try:
            await asyncio.sleep(0.2)
            answer = await asyncio.wait_for(
                _exchange_from("127.0.0.2", p.path_url, req("/preview/alice.s/8080/", p.token)),
                10,
            )
            assert answer.startswith(b"HTTP/1.1 200 OK"), answer
            open_ones = [c for c in idle if await _still_open(c)]
            assert len(open_ones) == 4
            refused = w.registry.get_sample_value(
                "sandboxd_preview_refused_connections_total", {"why": "source_full"}
            )
            assert refused == 8
        finally:
            for _, writer in idle:
                await close(writer)


async def _exchange_from(source: str, url: str, raw: bytes) -> bytes:
    reader, writer = await _connect(url, source, raw + b"")
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        return head + await reader.readexactly(2)
    finally:
        await close(writer)


async def test_a_head_not_whole_in_time_is_closed(tmp_path: Path) -> None:
    async with world(tmp_path, preview_head_timeout=0.5) as w:
        p = await _tenant_preview(w, "alice")
        await backend(w, 8080, _ok)
        half = [await _connect(p.path_url, "127.0.0.1", HALF) for _ in range(3)]
        silent = await _connect(p.path_url, "127.0.0.1")
        for conn in half:
            got = await _ended(conn)
            assert got.startswith(b"HTTP/1.1 408 ") and b"head_timeout" in got
            await close(conn[1])
        assert await _ended(silent) == b""
        await close(silent[1])
        # Kept alive: the next request may wait (idle timeout), its head then has the limit.
        kept = await _connect(p.path_url, "127.0.0.1", req("/preview/alice.s/8080/", p.token))
        assert (await kept[0].readuntil(b"\r\n\r\nok")).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(0.7)
        kept[1].write(HALF)
        assert (await _ended(kept)).startswith(b"HTTP/1.1 408 ")
        await close(kept[1])


async def test_a_full_pending_pool_closes_its_oldest_for_a_new_connection(
    tmp_path: Path,
) -> None:
    settings = {"preview_max_pending": 4, "preview_max_pending_per_source": 0}
    async with world(tmp_path, **settings) as w:
        p = await _tenant_preview(w, "alice")
        await backend(w, 8080, _ok)
        idle = [await _connect(p.path_url, f"127.0.0.{3 + i}", HALF) for i in range(4)]
        await asyncio.sleep(0.1)
        answer = await asyncio.wait_for(
            _exchange_from("127.0.0.2", p.path_url, req("/preview/alice.s/8080/", p.token)), 10
        )
        assert answer.startswith(b"HTTP/1.1 200 OK")
        assert await _ended(idle[0]) == b""  # the oldest went for it
        assert all([await _still_open(c) for c in idle[1:]])
        for _, writer in idle:
            await close(writer)


async def test_a_tenant_holding_its_cap_is_429_and_other_tenants_are_served(
    tmp_path: Path,
) -> None:
    async with world(tmp_path, preview_max_tenant_clients=2) as w:
        pa = await _tenant_preview(w, "alice", 8080)
        pb = await _tenant_preview(w, "bob", 9090)
        await backend(w, 8080, _ok)
        await backend(w, 9090, _ok)
        to_a = req("/preview/alice.s/8080/", pa.token)
        held = [await _connect(pa.path_url, "127.0.0.1", to_a) for _ in range(2)]
        for conn in held:
            await conn[0].readuntil(b"\r\n\r\nok")  # answered, and kept alive
        third = await _connect(pa.path_url, "127.0.0.1", to_a)
        got = await _ended(third)
        assert got.startswith(b"HTTP/1.1 429 ") and b"tenant_full" in got
        await close(third[1])
        answer = await _exchange_from(
            "127.0.0.1", pb.path_url, req("/preview/bob.s/9090/", pb.token)
        )
        assert answer.startswith(b"HTTP/1.1 200 OK")
        for _, writer in held:
            await close(writer)


async def _hold(url: str, raw: bytes, source: str = "127.0.0.1") -> Conn | bytes:
    """A kept-alive connection answered `ok`, or what the listener sent before it closed."""
    conn = await _connect(url, source, raw)
    head = await asyncio.wait_for(conn[0].readuntil(b"\r\n\r\n"), 10)
    if head.startswith(b"HTTP/1.1 200 OK"):
        await conn[0].readexactly(2)
        return conn
    got = head + await _ended(conn)
    await close(conn[1])
    return got


async def test_tenants_at_their_caps_leave_a_place_for_another_tenant(tmp_path: Path) -> None:
    """Two tenants holding their cap each (3) of a listener of 6: before, they filled it
    and a third tenant's request was 503. The pending pool (2) now stays out of the admitted
    connections' (4): bob's third connection is 503 once the two hold 2 each (after taking
    one of alice's idle ones), and carol's request takes the place of one of the heaviest
    tenant's idle connections and is answered."""
    settings = {
        "preview_max_clients": 6,
        "preview_max_pending": 2,
        "preview_max_tenant_clients": 3,
    }
    async with world(tmp_path, **settings) as w:
        pubs = {
            t: await _tenant_preview(w, t, port)
            for t, port in (("alice", 8080), ("bob", 8081), ("carol", 8082))
        }
        for port in (8080, 8081, 8082):
            await backend(w, port, _ok)

        def to(t: str) -> bytes:
            return req(f"/preview/{t}.s/{pubs[t].port}/", pubs[t].token)

        held = [await _hold(pubs["alice"].path_url, to("alice")) for _ in range(3)]
        held += [await _hold(pubs["bob"].path_url, to("bob")) for _ in range(3)]
        answer = await _hold(pubs["carol"].path_url, to("carol"))
        conns = [c for c in [*held, answer] if not isinstance(c, bytes)]
        try:
            assert not isinstance(answer, bytes), answer
            refused = [c for c in held if isinstance(c, bytes)]
            assert len(refused) == 1 and refused[0].startswith(b"HTTP/1.1 503 "), refused
            assert b"listener_full" in refused[0]
            still = [await _still_open(c) for c in conns]
            assert still.count(True) == 4, still  # one of alice's for bob, one for carol
            rebalanced = w.registry.get_sample_value(
                "sandboxd_preview_refused_connections_total", {"why": "rebalanced"}
            )
            assert rebalanced == 2
        finally:
            for conn in conns:
                await close(conn[1])


async def test_a_tls_handshake_is_under_the_head_timeout(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    settings = {
        "preview_head_timeout": 0.5,
        "tls_cert": pki.server_cert,
        "tls_key": pki.server_key,
    }
    async with world(tmp_path, **settings) as w:
        p = await _tenant_preview(w, "alice")
        await backend(w, 8080, _ok)
        stuck = await _connect(p.path_url, "127.0.0.1", b"\x16\x03\x01")  # a handshake begun
        assert await _ended(stuck) == b""
        await close(stuck[1])
        ctx = ssl.create_default_context(cafile=str(pki.ca_path))
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", listener_port(p.path_url), ssl=ctx, server_hostname="localhost"
        )
        writer.write(req("/preview/alice.s/8080/", p.token))
        assert (await reader.readuntil(b"\r\n\r\nok")).startswith(b"HTTP/1.1 200 OK")
        await close(writer)


def test_sources_and_the_bookkeeping() -> None:
    assert source_of(("2001:db8:1:2:3:4:5:6", 1, 0, 0)) == "2001:db8:1:2::/64"
    assert source_of(("::ffff:10.0.0.1", 1, 0, 0)) == "10.0.0.1"
    assert source_of(("10.0.0.1", 1)) == "10.0.0.1"
    a = Admission(max_clients=4, max_pending=2, max_pending_per_source=1, max_tenant_clients=1)
    t1 = a.arrive("s1", None)
    with pytest.raises(Full):
        a.arrive("s1", None)
    t2 = a.arrive("s2", None)
    a.admit(t1, "alice")
    with pytest.raises(Full):
        a.admit(t2, "alice")
    a.admit(t2, "bob")
    assert (a.pending, a.total, a.tenant_count("alice")) == (0, 2, 1)
    a.leave(t1)
    a.leave(t1)
    a.admit(t2, "alice")  # moved: bob's count goes, alice's comes
    assert (a.tenant_count("bob"), a.tenant_count("alice"), a.total) == (0, 1, 1)
    a.leave(t2)
    assert a.total == 0


def test_the_tenant_holding_the_most_gives_a_place_idle_ones_first() -> None:
    a = Admission(max_clients=6, max_pending=2)
    assert a.admitted_cap == 4
    alice = []
    for i in range(4):
        alice.append(a.arrive(f"s{i}", None))
        a.admit(alice[-1], "alice")
    alice[2].idle = True
    bob = [a.arrive("b", None) for _ in range(2)]
    a.admit(bob[0], "bob")  # alice 4 > 0 + 1: her idle one goes, not her oldest
    assert alice[2].tenant is None and alice[0].tenant == "alice"
    a.admit(bob[1], "bob")  # alice 3 > 1 + 1: her oldest goes
    assert alice[0].tenant is None
    assert (a.tenant_count("alice"), a.tenant_count("bob"), a.rebalanced) == (2, 2, 2)
    bob.append(a.arrive("b", None))
    with pytest.raises(Full) as full:
        a.admit(bob[2], "bob")  # alice 2 is not more than one over bob's 2
    assert full.value.why == "listener_full"
    a.leave(alice[0])  # the closed ones leave without counting twice
    a.leave(alice[2])
    assert (a.total, a.tenant_count("alice")) == (5, 2)
    a.admit(bob[2], "carol")  # a third tenant: one of the first of the heaviest goes
    counts = [a.tenant_count(t) for t in ("alice", "bob", "carol")]
    assert (counts, a.total, a.rebalanced) == ([1, 2, 1], 4, 3)
