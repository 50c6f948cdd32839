"""The preview domain and relay without Docker: `Previews` over the SessionManager on the
FakeEngine, and the listener relaying to local TCP servers through a loopback `PortDialer`
(the transport stands in for `sbx dial`; the HTTP handling under test is the product's).
Clients are raw sockets, so what arrives is checked byte for byte."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from preview_world import (
    LoopbackDialer,
    close,
    preview_parts,
)
from preview_world import (
    backend as _backend,
)
from preview_world import (
    exchange as _exchange,
)
from preview_world import (
    req as _req,
)
from preview_world import (
    world as _world,
)
from sandboxd import tenancy
from sandboxd.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from sandboxd.sessions import CreateSessionInput


async def test_chunked_answers_pass_byte_for_byte(tmp_path: Path) -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1\r\n \r\n0\r\nX-Trailer: yes\r\n\r\n"
    )

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(answer)
        await w.drain()
        w.close()

    async with _world(tmp_path) as world:
        s = await world.sessions.create(CreateSessionInput(session_id="s1"))
        await _backend(world, 8080, serve)
        p = await world.previews.publish(s.session_id, 8080, None, False)
        got = await _exchange(p.path_url, _req("/preview/s1/8080/", p.token))
        assert got == answer
        assert world.audit[-1].kind == "preview" and world.audit[-1].attributes["status"] == "200"
        sample = world.registry.get_sample_value
        assert sample("sandboxd_preview_requests_total", {"code": "200"}) == 1
        assert sample("sandboxd_preview_bytes_total", {"direction": "out"}) == len(answer)


async def test_keep_alive_reuses_one_sandbox_connection(tmp_path: Path) -> None:
    seen: list[bytes] = []

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await r.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            seen.append(head.split(b"\r\n", 1)[0])
            body = b"" if head.startswith(b"HEAD") else b"body"
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n" + body)
            await w.drain()

    async with _world(tmp_path) as world:
        s = await world.sessions.create(CreateSessionInput(session_id="s1"))
        await _backend(world, 8080, serve)
        p = await world.previews.publish(s.session_id, 8080, None, False)
        three = (
            _req("/preview/s1/8080/a", p.token)
            + _req("/preview/s1/8080/b", p.token, method="HEAD")
            + _req("/preview/s1/8080/c", p.token, "Connection: close")
        )
        got = await _exchange(p.path_url, three)
        assert got.count(b"HTTP/1.1 200 OK") == 3 and got.endswith(b"\r\n\r\nbody")
        assert seen == [b"GET /a HTTP/1.1", b"HEAD /b HTTP/1.1", b"GET /c HTTP/1.1"]
        assert world.dialer.dials == 1


async def test_every_request_on_a_connection_is_checked(tmp_path: Path) -> None:
    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            try:
                await r.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()

    async with _world(tmp_path) as world:
        await world.sessions.create(CreateSessionInput(session_id="s1"))
        await world.sessions.create(CreateSessionInput(session_id="s2"))
        await _backend(world, 8080, serve)
        p1 = await world.previews.publish("s1", 8080, None, False)
        await world.previews.publish("s2", 8080, None, False)
        # s1's token opens s1; the next request on the same connection goes to s2 with it.
        two = _req("/preview/s1/8080/", p1.token) + _req("/preview/s2/8080/", p1.token)
        got = await _exchange(p1.path_url, two)
        assert got.startswith(b"HTTP/1.1 200 OK") and b"403 Forbidden" in got
        assert got.count(b"\r\nok") == 1


@pytest.mark.parametrize(
    "extra",
    [
        ("Transfer-Encoding: chunked", "Content-Length: 5"),
        ("Content-Length: 5", "Content-Length: 6"),
        ("Content-Length: -1",),
        ("Transfer-Encoding: gzip",),
        ("Bad Header: x",),
        (" folded: x",),
    ],
)
async def test_ambiguous_requests_are_refused_before_the_sandbox(
    tmp_path: Path, extra: tuple[str, ...]
) -> None:
    reached: list[bytes] = []

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        reached.append(await r.read(65536))
        w.close()

    async with _world(tmp_path) as world:
        await world.sessions.create(CreateSessionInput(session_id="s1"))
        await _backend(world, 8080, serve)
        p = await world.previews.publish("s1", 8080, None, False)
        got = await _exchange(p.path_url, _req("/preview/s1/8080/", p.token, *extra) + b"hello")
        assert got.startswith(b"HTTP/1.1 400 "), got
        await asyncio.sleep(0.05)
        assert reached == []


async def test_expect_continue_and_a_streamed_upload(tmp_path: Path) -> None:
    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = await r.readuntil(b"\r\n\r\n")
        assert b"Expect: 100-continue" in head
        w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = b""
        while not body.endswith(b"0\r\n\r\n"):
            body += await r.read(65536)
        w.write(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await w.drain()

    async with _world(tmp_path) as world:
        await world.sessions.create(CreateSessionInput(session_id="s1"))
        await _backend(world, 8080, serve)
        p = await world.previews.publish("s1", 8080, None, False)
        chunked = b"3\r\nabc\r\n0\r\n\r\n"
        req = _req(
            "/preview/s1/8080/up",
            p.token,
            "Expect: 100-continue",
            "Transfer-Encoding: chunked",
            "Connection: close",
            method="POST",
        )
        got = await _exchange(p.path_url, req + chunked)
        assert got.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created")
        assert got.endswith(chunked)


async def test_a_silent_sandbox_is_504_and_a_closed_one_502(tmp_path: Path) -> None:
    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    async def closes(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.close()

    async with _world(tmp_path, preview_timeout=0.3) as world:
        await world.sessions.create(CreateSessionInput(session_id="s1"))
        await _backend(world, 8080, silent)
        await _backend(world, 8081, closes)
        p = await world.previews.publish("s1", 8080, None, False)
        got = await _exchange(p.path_url, _req("/preview/s1/8080/", p.token))
        assert got.startswith(b"HTTP/1.1 504 ") and b"X-Sandboxd-Refusal: sandbox_timeout" in got
        q = await world.previews.publish("s1", 8081, None, False)
        got = await _exchange(q.path_url, _req("/preview/s1/8081/", q.token))
        assert got.startswith(b"HTTP/1.1 502 ")


async def test_connections_over_the_session_limit_are_429(tmp_path: Path) -> None:
    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    async with _world(tmp_path, preview_max_connections=1) as world:
        await world.sessions.create(CreateSessionInput(session_id="s1"))
        await _backend(world, 8080, silent)
        p = await world.previews.publish("s1", 8080, None, False)
        first = asyncio.create_task(_exchange(p.path_url, _req("/preview/s1/8080/", p.token)))
        await asyncio.sleep(0.2)
        got = await _exchange(p.path_url, _req("/preview/s1/8080/", p.token))
        assert got.startswith(b"HTTP/1.1 429 ")
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first


async def test_ending_the_session_cuts_its_connections(tmp_path: Path) -> None:
    async def stream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        while True:
            w.write(b"data: x\n\n")
            await w.drain()
            await asyncio.sleep(0.05)

    async with _world(tmp_path) as world:
        await world.sessions.create(CreateSessionInput(session_id="s1"))
        await _backend(world, 8080, stream)
        p = await world.previews.publish("s1", 8080, None, False)
        port = int(p.path_url.split(":")[2].split("/")[0])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_req("/preview/s1/8080/", p.token))
        await reader.readuntil(b"data: x\n\n")
        assert await world.sessions.delete("s1")
        rest = await asyncio.wait_for(reader.read(), 5)  # ends: the connection was cut
        assert rest.count(b"data") < 200
        await close(writer)
        got = await _exchange(p.path_url, _req("/preview/s1/8080/", p.token))
        assert b"X-Sandboxd-Refusal: not_published" in got


async def test_publishing_rules(tmp_path: Path) -> None:
    async with _world(tmp_path, preview_max_ports=2, preview_max_ttl=3600.0) as world:
        await world.sessions.create(CreateSessionInput(session_id="s1"))
        with pytest.raises(InvalidArgument):
            await world.previews.publish("s1", 0, None, False)
        with pytest.raises(InvalidArgument):
            await world.previews.publish("s1", 80, 7200, False)
        with pytest.raises(InvalidArgument):
            await world.previews.publish("s1", 80, -1, False)
        await world.previews.publish("s1", 80, None, False)
        await world.previews.publish("s1", 81, None, False)
        await world.previews.publish("s1", 81, None, False)  # again: not one more
        with pytest.raises(ResourceExhausted):
            await world.previews.publish("s1", 82, None, False)
        listed, token = await world.previews.list_ports("s1", 1, "")
        assert [p.port for p in listed] == [80] and token and listed[0].token == ""
        listed, token = await world.previews.list_ports("s1", 1, token)
        assert [p.port for p in listed] == [81] and token == ""
        with pytest.raises(NotFound):
            await world.previews.unpublish("s1", 82)
        await world.previews.unpublish("s1", 81)
        await world.sessions.suspend("s1")  # a suspended session's ports are closed
        listed, _ = await world.previews.list_ports("s1", 0, "")
        assert listed == []


async def test_tenants_and_the_public_grant(tmp_path: Path) -> None:
    async with _world(tmp_path) as world:

        async def as_tenant(tenant: str, grants: tenancy.TenantGrants) -> None:
            tenancy.use_tenant(tenant, grants)
            await world.sessions.create(CreateSessionInput(session_id=f"{tenant}.s"))

        await asyncio.create_task(as_tenant("alice", tenancy.TenantGrants()))
        await asyncio.create_task(as_tenant("bob", tenancy.TenantGrants(preview_public=True)))

        async def publish(tenant: str, sid: str, public: bool) -> object:
            tenancy.use_tenant(tenant, tenancy.TenantGrants(preview_public=tenant == "bob"))
            return await world.previews.publish(sid, 80, None, public)

        with pytest.raises(PermissionDenied):
            await asyncio.create_task(publish("alice", "alice.s", True))
        with pytest.raises(NotFound):  # another tenant's session answers as a missing one
            await asyncio.create_task(publish("bob", "alice.s", False))
        p = await asyncio.create_task(publish("bob", "bob.s", True))
        assert p.public and p.token == ""  # type: ignore[attr-defined]


async def test_previews_off_without_a_listener(tmp_path: Path) -> None:
    async with preview_parts(tmp_path, LoopbackDialer(), preview_listen="") as world:
        await world.sessions.create(CreateSessionInput(session_id="s1"))
        with pytest.raises(FailedPrecondition) as err:
            await world.previews.publish("s1", 80, None, False)
        assert err.value.reason == "PREVIEWS_DISABLED"


async def test_a_kept_alive_sandbox_connection_closed_between_requests_is_redialed(
    tmp_path: Path,
) -> None:
    async def one_then_close(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # keep-alive, then gone
        await w.drain()

    async with _world(tmp_path) as world:
        await world.sessions.create(CreateSessionInput(session_id="s1"))
        await _backend(world, 8080, one_then_close)
        p = await world.previews.publish("s1", 8080, None, False)
        port = int(p.path_url.split(":")[2].split("/")[0])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(2):
                writer.write(_req("/preview/s1/8080/", p.token))
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 200 OK")
                assert await reader.readexactly(2) == b"ok"
                await asyncio.sleep(0.1)  # the sandbox side closes meanwhile
        finally:
            await close(writer)
        assert world.dialer.dials == 2


async def test_a_broken_answer_body_ends_the_connection_without_a_second_answer(
    tmp_path: Path,
) -> None:
    async def bad_chunks(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        await w.drain()
        await asyncio.sleep(5)

    async with _world(tmp_path) as world:
        await world.sessions.create(CreateSessionInput(session_id="s1"))
        await _backend(world, 8080, bad_chunks)
        p = await world.previews.publish("s1", 8080, None, False)
        got = await _exchange(p.path_url, _req("/preview/s1/8080/", p.token))
        assert got == b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        assert world.audit[-1].attributes["status"] == "502"


async def test_a_full_listener_answers_503_at_once(tmp_path: Path) -> None:
    async with _world(tmp_path, preview_max_clients=2) as world:
        await world.sessions.create(CreateSessionInput(session_id="s1"))
        p = await world.previews.publish("s1", 8080, None, False)
        port = int(p.path_url.split(":")[2].split("/")[0])
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await asyncio.sleep(0.05)
        try:
            got = await _exchange(p.path_url, b"")
            assert got.startswith(b"HTTP/1.1 503 ") and b"listener_full" in got
        finally:
            for _, w in idle:
                await close(w)


async def test_an_expired_lease_closes_the_previews(tmp_path: Path) -> None:
    async with _world(tmp_path) as world:
        s = await world.sessions.create(CreateSessionInput(session_id="s1"))
        p = await world.previews.publish("s1", 8080, None, False)
        s.lease_expires_at = datetime.now(UTC) - timedelta(seconds=1)
        await world.store.update(s)
        got = await _exchange(p.path_url, _req("/preview/s1/8080/", p.token))
        assert b"X-Sandboxd-Refusal: session_not_running" in got  # before the reaper ran
        assert await world.sessions.reap_once() == 1
        listed, _ = await world.previews.list_ports("s1", 0, "")
        assert listed == []
        got = await _exchange(p.path_url, _req("/preview/s1/8080/", p.token))
        assert b"X-Sandboxd-Refusal: not_published" in got


def test_a_request_to_a_dial_that_already_ended_is_dropped_for_its_error_line() -> None:
    """Over the agent's channel a write to an ended `sbx dial` fails at once (docker exec took
    it silently): the relay must still read the end and the error line, and answer 502."""
    from sandboxd.previews.dialer import ExecByteStream

    class Ended:
        exec_id = "x"

        def __init__(self) -> None:
            self.frames = [(2, b'{"error":"ECONNREFUSED","message":"nothing listens"}\n')]

        async def write(self, data: bytes) -> None:
            raise ConnectionError("the command has ended")

        async def read_joined(self, limit: int) -> tuple[int, bytes] | None:
            return self.frames.pop(0) if self.frames else None

    async def check() -> None:
        stream = ExecByteStream(Ended())  # type: ignore[arg-type]
        await stream.write(b"GET / HTTP/1.1\r\n\r\n")
        assert await stream.read_some() == b""
        assert stream.failure() == "ECONNREFUSED"

    asyncio.run(check())
