"""Hostile sandboxes and hostile clients of the preview listener: no answer of one sandbox
and no byte sequence of one client makes a request reach a session its own host or path and
token do not name. Clients are raw sockets; the sandboxes are local TCP servers of the test
(`preview_world`), each recording what reached it."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from preview_world import Handler, World, backend, close, exchange, listener_port, req, world
from sandboxd import tenancy
from sandboxd.previews.publishing import Preview
from sandboxd.sessions import CreateSessionInput


async def _tenant_preview(w: World, tenant: str, port: int) -> Preview:
    """Session `<tenant>.s` of `tenant` with `port` published (a token of its own)."""

    async def run() -> Preview:
        tenancy.use_tenant(tenant, tenancy.TenantGrants())
        await w.sessions.create(CreateSessionInput(session_id=f"{tenant}.s"))
        return await w.previews.publish(f"{tenant}.s", port, None, False)

    return await asyncio.create_task(run())


class Recorder:
    """A sandbox port that records every byte that reached it."""

    def __init__(self) -> None:
        self.seen = bytearray()

    def __contains__(self, data: bytes) -> bool:
        return data in self.seen


SWITCHING = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"


def switching_on_everything(rec: Recorder, answer: bytes = SWITCHING) -> Handler:
    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        rec.seen += await r.readuntil(b"\r\n\r\n")
        w.write(answer)
        await w.drain()
        while data := await r.read(65536):
            rec.seen += data

    return serve


def answering_ok(rec: Recorder) -> Handler:
    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            try:
                rec.seen += await r.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()

    return serve


async def test_a_101_to_a_plain_request_never_captures_the_next_request(tmp_path: Path) -> None:
    """Sandbox A answers 101 to a plain GET: the client gets a 502 and its connection ends;
    the next request, tenant B's token for B's preview, reaches B and never A (kept-alive
    and pipelined both)."""
    a, b = Recorder(), Recorder()
    async with world(tmp_path) as w:
        pa = await _tenant_preview(w, "alice", 8080)
        pb = await _tenant_preview(w, "bob", 9090)
        await backend(w, 8080, switching_on_everything(a))
        await backend(w, 9090, answering_ok(b))
        to_a = req("/preview/alice.s/8080/", pa.token)
        to_b = req("/preview/bob.s/9090/", pb.token)

        # Kept alive: the pooled client sends B's request once A's answer head arrived.
        reader, writer = await asyncio.open_connection("127.0.0.1", listener_port(pa.path_url))
        try:
            writer.write(to_a)
            first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            writer.write(to_b)
            rest = await asyncio.wait_for(reader.read(), 3)
        except ConnectionError:
            rest = b""
        except TimeoutError:
            rest = b"(still open)"
        finally:
            await close(writer)
        await asyncio.sleep(0.1)
        assert pb.token.encode() not in a
        # Pipelined: both requests in one write.
        both = await exchange(pa.path_url, to_a + to_b)
        await asyncio.sleep(0.1)
        assert pb.token.encode() not in a
        assert first.startswith(b"HTTP/1.1 502 ") and b"Switching" not in first + rest
        assert both.startswith(b"HTTP/1.1 502 ") and both.count(b"HTTP/1.1") == 1
        # B still answers its own requests, on a connection of their own.
        assert (
            await exchange(
                pb.path_url, to_b + req("/preview/bob.s/9090/", pb.token, "Connection: close")
            )
        ).count(b"200 OK") == 2


def _head(path: str, token: str, *lines: bytes, start: bytes = b"") -> bytes:
    first = start or f"GET {path} HTTP/1.1".encode()
    token_line = f"X-Sandboxd-Token: {token}".encode()
    return b"\r\n".join([first, b"Host: x", token_line, *lines, b"", b""])


# Each a request that two HTTP parsers could read differently; `{P}` is the preview's path.
HOSTILE_REQUESTS = {
    "CL and TE": (b"Content-Length: 5", b"Transfer-Encoding: chunked"),
    "two CL": (b"Content-Length: 5", b"Content-Length: 5"),
    "a CL list": (b"Content-Length: 5, 5",),
    "a signed CL": (b"Content-Length: +5",),
    "TE not chunked": (b"Transfer-Encoding: gzip",),
    "TE chunked not last": (b"Transfer-Encoding: chunked, gzip",),
    "TE twice": (b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"),
    "TE xchunked": (b"Transfer-Encoding: xchunked",),
    "obs-fold": (b"X-A: a", b" b"),
    "obs-fold of TE": (b"Transfer-Encoding:", b" chunked"),
    "bare LF": (b"X-A: a\nTransfer-Encoding: chunked",),
    "bare CR": (b"X-A: a\rTransfer-Encoding: chunked",),
    "NUL": (b"X-A: a\x00b",),
    "space before colon": (b"Transfer-Encoding : chunked",),
    "a second Host": (b"Host: y",),
    "a control in a value": (b"X-A: a\x01b",),
}
HOSTILE_STARTS = {
    "HTTP/1.0 with TE": (b"POST {P} HTTP/1.0", b"Transfer-Encoding: chunked"),
    "HTTP/2.0 line": (b"GET {P} HTTP/2.0",),
    "HTTP/1.9 line": (b"GET {P} HTTP/1.9",),
    "a control in the target": (b"GET {P}a\x01b HTTP/1.1",),
    "a bad method": (b"G(T {P} HTTP/1.1",),
    "bare LF line end": (b"GET {P} HTTP/1.1\nX: y",),
}
HOSTILE_CHUNKS = {
    "a chunk size with spaces": b" 5\r\nhello\r\n0\r\n\r\n",
    "a 0x chunk size": b"0x5\r\nhello\r\n0\r\n\r\n",
    "a chunk size of 17 digits": b"00000000000000005\r\nhello\r\n0\r\n\r\n",
    "a bare LF in a chunk extension": b"5;a\nb\r\nhello\r\n0\r\n\r\n",
    "a bare CR in a chunk extension": b"5;a\rb\r\nhello\r\n0\r\n\r\n",
    "a chunk not followed by CRLF": b"5\r\nabcdeXX0\r\n\r\n",
    "a bad trailer": b"0\r\nX-A: a\nb\r\n\r\n",
    "a chunk line past the limit": b"5;" + b"a" * 5000 + b"\r\nhello\r\n0\r\n\r\n",
}


async def _refused(tmp_path: Path, build: object, expect: bytes) -> None:
    """Sends `build(path, token)` then a valid request on one connection: the answer is one
    `expect`, the connection ends, and the sandbox saw none of the hostile head's bytes."""
    rec = Recorder()
    async with world(tmp_path) as w:
        p = await _tenant_preview(w, "alice", 8080)
        await backend(w, 8080, answering_ok(rec))
        path = "/preview/alice.s/8080/"
        assert callable(build)
        hostile: bytes = build(path, p.token)
        got = await exchange(p.path_url, hostile + req(path, p.token))
        assert got.startswith(expect), got
        assert got.count(b"HTTP/1.1 ") == 1  # one answer, then the end of the connection
        assert b"smuggled" not in rec and b"hello" not in rec


@pytest.mark.parametrize("lines", HOSTILE_REQUESTS.values(), ids=HOSTILE_REQUESTS.keys())
async def test_hostile_request_heads_are_400(tmp_path: Path, lines: tuple[bytes, ...]) -> None:
    smuggled = b"hello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    await _refused(
        tmp_path, lambda path, token: _head(path, token, *lines) + smuggled, b"HTTP/1.1 400 "
    )


@pytest.mark.parametrize("lines", HOSTILE_STARTS.values(), ids=HOSTILE_STARTS.keys())
async def test_hostile_request_lines_are_400(tmp_path: Path, lines: tuple[bytes, ...]) -> None:
    def build(path: str, token: str) -> bytes:
        start, *rest = (line.replace(b"{P}", path.encode()) for line in lines)
        return _head(path, token, *rest, start=start) + b"hello smuggled"

    await _refused(tmp_path, build, b"HTTP/1.1 400 ")


@pytest.mark.parametrize("body", HOSTILE_CHUNKS.values(), ids=HOSTILE_CHUNKS.keys())
async def test_hostile_chunked_bodies_end_the_connection(tmp_path: Path, body: bytes) -> None:
    """The head was sound, so it reached the sandbox; the bad chunk line did not, and nothing
    after it is read as a request."""
    rec = Recorder()
    async with world(tmp_path) as w:
        p = await _tenant_preview(w, "alice", 8080)

        async def serve(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
            rec.seen += await r.readuntil(b"\r\n\r\n")
            while data := await r.read(65536):
                rec.seen += data

        await backend(w, 8080, serve)
        path = "/preview/alice.s/8080/"
        head = _head(
            path, p.token, b"Transfer-Encoding: chunked", start=f"POST {path} HTTP/1.1".encode()
        )
        got = await exchange(p.path_url, head + body + b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"smuggled" not in rec and b"hello" not in rec
        assert b"HTTP/1.1 200" not in got


async def test_an_oversized_head_is_400(tmp_path: Path) -> None:
    big = b"X-A: " + b"a" * 70_000
    await _refused(tmp_path, lambda path, token: _head(path, token, big), b"HTTP/1.1 400 ")


async def test_a_bare_lf_head_is_refused_at_once(tmp_path: Path) -> None:
    """A head that never has its CRLF blank line is refused on its first bad byte, not left
    to the head's timeout."""
    async with world(tmp_path) as w:
        p = await _tenant_preview(w, "alice", 8080)
        port = listener_port(p.path_url)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /preview/alice.s/8080/ HTTP/1.1\nHost: x\n")
        got = await asyncio.wait_for(reader.read(), 5)
        await close(writer)
        assert got.startswith(b"HTTP/1.1 400 ")


WS_KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455's example; its accept is below
WS_ACCEPT = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
WS_REQUEST = (
    "Connection: Upgrade",
    "Upgrade: websocket",
    f"Sec-WebSocket-Key: {WS_KEY}",
    "Sec-WebSocket-Version: 13",
)


def _ws_answer(accept: str = WS_ACCEPT, protocol: str = "websocket") -> bytes:
    return (
        f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: {protocol}\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {accept}\r\n\r\n"
    ).encode()


# (what the request adds, what the sandbox answers): each ends with a 502 and the connection.
HOSTILE_ANSWERS = {
    "101 to a plain GET": ((), SWITCHING),
    "101 with a wrong accept": (WS_REQUEST, _ws_answer(accept="AAAAAAAAAAAAAAAAAAAAAAAAAAA=")),
    "101 to another protocol": (WS_REQUEST, _ws_answer(protocol="h2c")),
    "101 without Upgrade": (WS_REQUEST, b"HTTP/1.1 101 Switching Protocols\r\n\r\n"),
    "102 Processing": ((), b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 200 OK\r\n\r\n"),
    "100 without Expect": ((), b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n"),
    "CL and TE": (
        (),
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
    ),
    "two CL": ((), b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"),
    "obs-fold": ((), b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 2\r\n\r\nok"),
    "bare LF": ((), b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"),
    "NUL": ((), b"HTTP/1.1 200 OK\r\nX-A: a\x00\r\nContent-Length: 2\r\n\r\nok"),
    "status 600": ((), b"HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nok"),
    "HTTP/2 status line": ((), b"HTTP/2 200 OK\r\nContent-Length: 2\r\n\r\nok"),
    "endless 103s": ((), b"HTTP/1.1 103 Early Hints\r\n\r\n" * 40),
    "TE chunked twice": (
        (),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nok\r\n0\r\n\r\n",
    ),
    "TE chunked, chunked": (
        (),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    ),
}


@pytest.mark.parametrize(("extra", "answer"), HOSTILE_ANSWERS.values(), ids=HOSTILE_ANSWERS.keys())
async def test_hostile_answers_are_502_and_end_the_connection(
    tmp_path: Path, extra: tuple[str, ...], answer: bytes
) -> None:
    a, b = Recorder(), Recorder()
    async with world(tmp_path) as w:
        pa = await _tenant_preview(w, "alice", 8080)
        pb = await _tenant_preview(w, "bob", 9090)
        await backend(w, 8080, switching_on_everything(a, answer))
        await backend(w, 9090, answering_ok(b))
        to_a = req("/preview/alice.s/8080/", pa.token, *extra)
        got = await exchange(pa.path_url, to_a + req("/preview/bob.s/9090/", pb.token))
        await asyncio.sleep(0.05)
        assert got.startswith(b"HTTP/1.1 502 ") and got.count(b"HTTP/1.1 ") == 1, got
        assert b"sandbox_protocol" in got
        assert pb.token.encode() not in a and b.seen == b""


async def test_a_matching_websocket_upgrade_is_tunnelled(tmp_path: Path) -> None:
    """The client's frames, sent once the 101 arrived (RFC 6455 4.1), reach the sandbox."""
    a = Recorder()
    async with world(tmp_path) as w:
        pa = await _tenant_preview(w, "alice", 8080)
        await backend(w, 8080, switching_on_everything(a, _ws_answer()))
        reader, writer = await asyncio.open_connection("127.0.0.1", listener_port(pa.path_url))
        try:
            writer.write(req("/preview/alice.s/8080/", pa.token, *WS_REQUEST))
            got = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            writer.write(b"\x81\x02hi")
            await writer.drain()
            for _ in range(50):
                if b"\x81\x02hi" in a:
                    break
                await asyncio.sleep(0.02)
        finally:
            await close(writer)
        assert got.startswith(b"HTTP/1.1 101 ") and f"Accept: {WS_ACCEPT}".encode() in got
        assert b"\x81\x02hi" in a


async def test_a_request_pipelined_behind_an_upgrade_never_enters_the_tunnel(
    tmp_path: Path,
) -> None:
    """A WebSocket handshake to tenant A's preview with tenant B's request pipelined behind
    it, and A grants the upgrade with the right accept: the client gets 400 and its
    connection ends; B's request and token never reach A (before: they went into A's tunnel,
    past the routing and the token check). A client that waits for the 101 is tunnelled."""
    a, b = Recorder(), Recorder()
    async with world(tmp_path) as w:
        pa = await _tenant_preview(w, "alice", 8080)
        pb = await _tenant_preview(w, "bob", 9090)
        await backend(w, 8080, switching_on_everything(a, _ws_answer()))
        await backend(w, 9090, answering_ok(b))
        handshake = req("/preview/alice.s/8080/", pa.token, *WS_REQUEST)
        got = await exchange(pa.path_url, handshake + req("/preview/bob.s/9090/", pb.token))
        await asyncio.sleep(0.1)
        assert pb.token.encode() not in a and b"/preview/bob.s" not in a, bytes(a.seen)
        assert got.startswith(b"HTTP/1.1 400 ") and got.count(b"HTTP/1.1 ") == 1, got
        assert b"Switching" not in got and b.seen == b""


async def test_a_101_to_an_http10_upgrade_is_502(tmp_path: Path) -> None:
    """HTTP/1.0 has no Upgrade (RFC 9110 7.8 has the server ignore it): a 101 to one is not
    a grant, and the request pipelined behind it never reaches the sandbox."""
    a, b = Recorder(), Recorder()
    async with world(tmp_path) as w:
        pa = await _tenant_preview(w, "alice", 8080)
        pb = await _tenant_preview(w, "bob", 9090)
        answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\n"
        await backend(w, 8080, switching_on_everything(a, answer))
        await backend(w, 9090, answering_ok(b))
        one = (
            f"GET /preview/alice.s/8080/ HTTP/1.0\r\nX-Sandboxd-Token: {pa.token}\r\n"
            "Connection: upgrade, keep-alive\r\nUpgrade: foo\r\n\r\n"
        ).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", listener_port(pa.path_url))
        try:
            writer.write(one)
            first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            writer.write(req("/preview/bob.s/9090/", pb.token))
            with contextlib.suppress(ConnectionError):
                await asyncio.wait_for(reader.read(), 5)
        finally:
            await close(writer)
        await asyncio.sleep(0.1)
        assert first.startswith(b"HTTP/1.1 502 "), first
        assert pb.token.encode() not in a


@pytest.mark.parametrize(
    "extra",
    [
        ("Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13"),
        (
            "Connection: Upgrade",
            "Upgrade: websocket",
            "Sec-WebSocket-Key: c2hvcnQ=",
            "Sec-WebSocket-Version: 13",
        ),
        (
            "Connection: Upgrade",
            "Upgrade: websocket",
            f"Sec-WebSocket-Key: {WS_KEY}",
            "Sec-WebSocket-Version: 8",
        ),
        (*WS_REQUEST, "Content-Length: 2"),
    ],
    ids=["no key", "a short key", "version 8", "a body"],
)
async def test_invalid_upgrade_requests_are_400(tmp_path: Path, extra: tuple[str, ...]) -> None:
    rec = Recorder()
    async with world(tmp_path) as w:
        p = await _tenant_preview(w, "alice", 8080)
        await backend(w, 8080, switching_on_everything(rec, _ws_answer()))
        got = await exchange(p.path_url, req("/preview/alice.s/8080/", p.token, *extra) + b"hi")
        assert got.startswith(b"HTTP/1.1 400 ") and rec.seen == b""


async def test_interim_answers(tmp_path: Path) -> None:
    """103 is dropped, 100 goes through once to a request that expected it."""
    answers = {
        "/hints": b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        "/continue": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    }

    async def serve(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
        head = await r.readuntil(b"\r\n\r\n")
        path = head.split(b" ", 2)[1].decode()
        wr.write(answers[path])
        await wr.drain()

    async with world(tmp_path) as w:
        p = await _tenant_preview(w, "alice", 8080)
        await backend(w, 8080, serve)
        base = "/preview/alice.s/8080"
        got = await exchange(p.path_url, req(f"{base}/hints", p.token, "Connection: close"))
        assert got.startswith(b"HTTP/1.1 200 OK") and b"103" not in got
        expect = ("Expect: 100-continue", "Connection: close")
        got = await exchange(p.path_url, req(f"{base}/continue", p.token, *expect))
        assert got.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")


async def test_stray_bytes_after_an_answer_are_never_the_next_answer(tmp_path: Path) -> None:
    """A body on a 204 or on an answer to HEAD answers nothing: the client never reads it,
    and the sandbox's connection is not used again (its next answer comes on a new one)."""

    async def serve(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await r.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            if b"/nobody" in head:
                wr.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 8\r\n\r\nSTRAY204")
            elif head.startswith(b"HEAD"):
                wr.write(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSTRAYHED")
            else:
                wr.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await wr.drain()

    async with world(tmp_path) as w:
        p = await _tenant_preview(w, "alice", 8080)
        await backend(w, 8080, serve)
        base = "/preview/alice.s/8080"
        got = await exchange(
            p.path_url,
            req(f"{base}/nobody", p.token)
            + req(f"{base}/a", p.token)
            + req(f"{base}/h", p.token, method="HEAD")
            + req(f"{base}/b", p.token, "Connection: close"),
        )
        assert b"STRAY" not in got and got.count(b"HTTP/1.1 ") == 4, got
        assert (
            got.startswith(b"HTTP/1.1 204 No Content\r\n")
            and b"Content-Length: 8\r\n\r\nHTTP/1.1 200" in got
        )
        assert got.endswith(b"\r\n\r\nok")
        assert b"204 No Content\r\nContent-Length" not in got
        assert w.dialer.dials == 3


async def test_requests_for_other_previews_never_share_a_sandbox_connection(
    tmp_path: Path,
) -> None:
    a, b = Recorder(), Recorder()
    async with world(tmp_path) as w:
        pa = await _tenant_preview(w, "alice", 8080)
        pb = await _tenant_preview(w, "bob", 9090)
        await backend(w, 8080, answering_ok(a))
        await backend(w, 9090, answering_ok(b))
        to_a = req("/preview/alice.s/8080/1", pa.token)
        to_b = req("/preview/bob.s/9090/2", pb.token)
        last = req("/preview/alice.s/8080/3", pa.token, "Connection: close")
        got = await exchange(pa.path_url, to_a + to_b + last)
        assert got.count(b"200 OK") == 3
        assert b"GET /1 " in a.seen and b"GET /3 " in a.seen and b"GET /2 " not in a.seen
        assert b"GET /2 " in b.seen and b"GET /1 " not in b.seen
        assert pb.token.encode() not in a and pa.token.encode() not in b
        assert w.dialer.dials == 3


async def test_http10_keeps_a_connection_only_when_both_ends_say_keep_alive(
    tmp_path: Path,
) -> None:
    """An HTTP/1.0 request without `Connection: keep-alive` ends its connection with its
    answer: a request pipelined after it is never read (nor relayed)."""
    rec = Recorder()
    async with world(tmp_path) as w:
        p = await _tenant_preview(w, "alice", 8080)
        await backend(w, 8080, answering_ok(rec))
        one = f"GET /preview/alice.s/8080/one HTTP/1.0\r\nX-Sandboxd-Token: {p.token}\r\n\r\n"
        got = await exchange(p.path_url, one.encode() + req("/preview/alice.s/8080/two", p.token))
        assert got.count(b"200 OK") == 1
        await asyncio.sleep(0.05)
        assert b"/one" in rec and b"/two" not in rec


def _answering(answer: bytes) -> Handler:
    """Answers `answer` as soon as a request head arrived, without reading its body."""

    async def serve(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        wr.write(answer)
        await wr.drain()
        while await r.read(65536):
            pass

    return serve


async def test_an_answer_read_until_close_ends_a_kept_alive_connection(tmp_path: Path) -> None:
    """A's answer has no length (its body ends when A closes): the pipelined request for B
    behind it is never read, never reaches A, and the client reads one answer."""
    a, b = Recorder(), Recorder()
    async with world(tmp_path) as w:
        pa = await _tenant_preview(w, "alice", 8080)
        pb = await _tenant_preview(w, "bob", 9090)

        async def serve(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
            a.seen += await r.readuntil(b"\r\n\r\n")
            wr.write(b"HTTP/1.1 200 OK\r\n\r\nuntil-close")
            await wr.drain()
            wr.close()

        await backend(w, 8080, serve)
        await backend(w, 9090, answering_ok(b))
        to_a = req("/preview/alice.s/8080/", pa.token)
        got = await exchange(pa.path_url, to_a + req("/preview/bob.s/9090/", pb.token))
        await asyncio.sleep(0.05)
        assert got.startswith(b"HTTP/1.1 200 OK") and got.endswith(b"until-close"), got
        assert got.count(b"HTTP/1.1 ") == 1 and b.seen == b"" and pb.token.encode() not in a


async def test_an_answer_before_the_request_body_ends_the_connection(tmp_path: Path) -> None:
    """A answers a POST before its body is whole: the rest of the body, a request for B
    shaped to look like the next one, is never parsed as a request."""
    b = Recorder()
    async with world(tmp_path) as w:
        pa = await _tenant_preview(w, "alice", 8080)
        pb = await _tenant_preview(w, "bob", 9090)
        await backend(w, 8080, _answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
        await backend(w, 9090, answering_ok(b))
        smuggled = req("/preview/bob.s/9090/", pb.token)
        head = req("/preview/alice.s/8080/", pa.token, f"Content-Length: {len(smuggled) + 50}")
        reader, writer = await asyncio.open_connection("127.0.0.1", listener_port(pa.path_url))
        rest = b""
        try:
            writer.write(head.replace(b"GET", b"POST", 1))
            await writer.drain()
            first = await asyncio.wait_for(reader.readuntil(b"ok"), 10)
            writer.write(smuggled + b"x" * 50)
            with contextlib.suppress(ConnectionError):
                rest = await asyncio.wait_for(reader.read(), 5)
        finally:
            await close(writer)
        await asyncio.sleep(0.05)
        assert first.startswith(b"HTTP/1.1 200 OK") and b"HTTP/1.1" not in rest
        assert b.seen == b""


async def test_a_sandbox_never_sets_the_listeners_own_cookie(tmp_path: Path) -> None:
    """Tenant B's sandbox answers with `Set-Cookie: sandboxd_preview=...` scoped to A's
    preview path (one origin for every path-routed preview) or to the whole preview domain:
    the client never receives it, so B cannot replace A's token in a visitor's browser. Its
    other cookies pass."""
    async with world(tmp_path) as w:
        pb = await _tenant_preview(w, "bob", 9090)
        answer = (
            b"HTTP/1.1 200 OK\r\n"
            b"Set-Cookie: sandboxd_preview=forged; Path=/preview/alice.s/8080/\r\n"
            b"Set-Cookie:  sandboxd_preview =forged; Domain=.preview.test; Path=/\r\n"
            b"Set-Cookie: app=kept; Path=/preview/bob.s/9090/\r\n"
            b"Content-Length: 2\r\n\r\nok"
        )
        await backend(w, 9090, _answering(answer))
        got = await exchange(
            pb.path_url, req("/preview/bob.s/9090/", pb.token, "Connection: close")
        )
        assert got.startswith(b"HTTP/1.1 200 OK"), got
        assert b"forged" not in got and b"app=kept" in got


async def test_an_interim_answer_reaches_the_client_without_the_sandboxs_headers(
    tmp_path: Path,
) -> None:
    """The `100 Continue` a client waits for is relayed bare: the headers of a sandbox's
    interim answer (the listener's own cookie for another preview's path, origin-wide ones,
    a Content-Length a lenient client would read a body by) never reach the client (before:
    relayed as sent, past every filter of the final answer)."""
    async with world(tmp_path) as w:
        pb = await _tenant_preview(w, "bob", 9090)
        interim = (
            b"HTTP/1.1 100 Continue\r\n"
            b"Set-Cookie: sandboxd_preview=forged; Path=/preview/alice.s/8080/\r\n"
            + b"".join(h + b"\r\n" for h in ORIGIN_WIDE_HEADERS)
            + b"Content-Length: 40\r\n\r\n"
        )
        await backend(
            w, 9090, _answering(interim + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        )
        expect = ("Expect: 100-continue", "Connection: close")
        got = await exchange(pb.path_url, req("/preview/bob.s/9090/", pb.token, *expect))
        assert got.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK"), got
        assert b"forged" not in got and b"Service-Worker" not in got, got


ORIGIN_WIDE_HEADERS = (
    b"Service-Worker-Allowed: /",
    b'NEL: {"report_to":"x","max_age":86400,"success_fraction":1.0}',
    b'Report-To: {"group":"x","max_age":86400,"endpoints":[{"url":"https://sink.test/"}]}',
    b'Clear-Site-Data: "cookies"',
    b'Alt-Svc: h2="sink.test:443"',
    b"Strict-Transport-Security: max-age=31536000; includeSubDomains",
)
ORIGIN_WIDE = (
    b"HTTP/1.1 200 OK\r\n"
    + b"".join(h + b"\r\n" for h in ORIGIN_WIDE_HEADERS)
    + b"X-Own: kept\r\nContent-Length: 2\r\n\r\nok"
)


async def test_a_path_routed_sandbox_sets_nothing_for_the_whole_origin(tmp_path: Path) -> None:
    """Every path-routed preview shares the listener's origin: a sandbox's
    `Service-Worker-Allowed: /` would let its service worker see every preview's requests
    (a shared link's `sandboxd_token` among them), a NEL policy would report every request's
    URL to it, `Clear-Site-Data` would clear every preview's cookie, `Alt-Svc` and HSTS would
    steer the whole origin. They are removed there; a host-routed preview, an origin of its
    own, keeps them."""
    async with world(tmp_path, preview_domain="preview.test") as w:
        pb = await _tenant_preview(w, "bob", 9090)
        await backend(w, 9090, _answering(ORIGIN_WIDE))
        path = await exchange(
            pb.path_url, req("/preview/bob.s/9090/sw.js", pb.token, "Connection: close")
        )
        host_head = (
            f"GET /sw.js HTTP/1.1\r\nHost: 9090-bob.s.preview.test\r\n"
            f"X-Sandboxd-Token: {pb.token}\r\nConnection: close\r\n\r\n"
        ).encode()
        host = await exchange(pb.path_url, host_head)
        assert path.startswith(b"HTTP/1.1 200 OK") and host.startswith(b"HTTP/1.1 200 OK")
        for header in ORIGIN_WIDE_HEADERS:
            assert header.split(b":")[0] not in path, path
            assert header in host, host
        assert b"X-Own: kept" in path
