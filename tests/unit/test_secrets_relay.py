"""The intercepting relay on loopback TCP (no Docker): what the upstream receives for each
binding kind, misdirection, rotation on a keep-alive connection, framing (chunked,
100-continue, smuggling), an unreadable value; and the session CA's certificates."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from sandboxd.models import SecretBinding
from sandboxd.secrets.ca import SessionCA
from sandboxd.secrets.mitm import HttpRelay, Secrets
from sandboxd.secrets.vault import SecretUnavailable

VALUE = b"the-real-value"
PH_API = "sbx_secret_" + "a" * 40
PH_OTHER = "sbx_secret_" + "b" * 40
API = SecretBinding(
    name="API_KEY",
    hosts=("api.test",),
    header="Authorization",
    template="Bearer {secret}",
    placeholder=PH_API,
)
OTHER = SecretBinding(name="OTHER_KEY", hosts=("other.test",), placeholder=PH_OTHER)


@dataclass
class Upstream:
    """Answers each request with the head and body length it received (keep-alive)."""

    heads: list[dict[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    connections: int = 0

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await r.readuntil(b"\r\n\r\n"):
                lines = head.decode("latin-1").split("\r\n")
                fields = dict(line.split(": ", 1) for line in lines[1:] if line)
                fields[":start"] = lines[0]
                self.heads.append(fields)
                body = b""
                if fields.get("Transfer-Encoding") == "chunked":
                    while size := int((await r.readuntil(b"\r\n")).split(b";")[0], 16):
                        body += (await r.readexactly(size + 2))[:-2]
                    while await r.readuntil(b"\r\n") != b"\r\n":
                        pass  # trailers
                else:
                    body = await r.readexactly(int(fields.get("Content-Length", "0")))
                self.bodies.append(body)
                answer = json.dumps({"n": len(body)}).encode()
                w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                w.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(answer), answer))
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()


@dataclass
class Rig:
    upstream: Upstream
    events: list[tuple[str, str, str]]
    view: list[Secrets]
    port: int


def value_of(b: SecretBinding) -> bytes:
    if b.name == "GONE":
        raise SecretUnavailable("sealed under another key")
    return VALUE if b.name == "API_KEY" else b"other-value"


@pytest.fixture
async def rig() -> AsyncIterator[Callable[[str], Rig]]:
    servers: list[asyncio.Server] = []

    async def make(host: str) -> Rig:
        upstream = Upstream()
        up = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
        up_port = up.sockets[0].getsockname()[1]
        events: list[tuple[str, str, str]] = []
        view = [Secrets((API, OTHER), False, value_of)]

        async def front(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            ur, uw = await asyncio.open_connection("127.0.0.1", up_port)

            async def send(
                wr: asyncio.StreamWriter, data: bytes, way: str, counts: dict[str, int]
            ) -> None:
                counts[way] += len(data)
                wr.write(data)
                await wr.drain()

            relay = HttpRelay(host, lambda: view[0], lambda *e: events.append(e), send, 5.0)
            try:
                await relay.run(r, w, ur, uw)
            finally:
                await w.drain()
                w.close()
                uw.close()

        srv = await asyncio.start_server(front, "127.0.0.1", 0)
        servers.extend([up, srv])
        return Rig(upstream, events, view, srv.sockets[0].getsockname()[1])

    yield make  # type: ignore[misc]
    for s in servers:
        s.close()


async def exchange(port: int, *requests: bytes) -> list[bytes]:
    """Send each request on one connection, reading its whole answer before the next."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    answers = []
    try:
        for req in requests:
            w.write(req)
            await w.drain()
            head = await r.readuntil(b"\r\n\r\n")
            if b"100 Continue" in head:
                head += await r.readuntil(b"\r\n\r\n")
            if b"chunked" in head:
                rest = await r.readuntil(b"0\r\n\r\n")
            else:
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                rest = await r.readexactly(length)
            answers.append(head + rest)
    finally:
        w.close()
    return answers


def get(path: str, *headers: str, host: str = "api.test") -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", f"Host: {host}", *headers]) + "\r\n\r\n").encode()


async def test_header_template_set_whatever_the_sandbox_sent(rig) -> None:  # type: ignore[no-untyped-def]
    x = await rig("api.test")
    await exchange(x.port, get("/", "Authorization: Bearer fake", "authorization: dup"))
    head = x.upstream.heads[0]
    assert head["Authorization"] == "Bearer the-real-value"
    assert "authorization" not in head  # the sandbox's own copies are gone
    assert x.events == [("secret_injected", "GET", "API_KEY")]


async def test_placeholder_replaced_in_any_header_not_in_the_url(rig) -> None:  # type: ignore[no-untyped-def]
    x = await rig("other.test")
    await exchange(
        x.port, get(f"/?k={PH_OTHER}", f"X-Key: k={PH_OTHER};{PH_OTHER}", host="other.test")
    )
    head = x.upstream.heads[0]
    assert head["X-Key"] == "k=other-value;other-value"
    assert PH_OTHER in head[":start"]  # never in a URL (it would be in upstream logs)


async def test_placeholder_elsewhere_relayed_unreplaced_and_recorded(rig) -> None:  # type: ignore[no-untyped-def]
    x = await rig("other.test")
    await exchange(x.port, get("/", f"X-Leak: {PH_API}", host="other.test"))
    assert x.upstream.heads[0]["X-Leak"] == PH_API
    assert ("secret_misdirected", "GET", "API_KEY") in x.events
    assert VALUE.decode() not in json.dumps(x.upstream.heads)


async def test_refuse_misdirected_option_sends_nothing(rig) -> None:  # type: ignore[no-untyped-def]
    x = await rig("other.test")
    x.view[0] = Secrets((API, OTHER), True, value_of)
    (answer,) = await exchange(x.port, get("/", f"X-Leak: {PH_API}", host="other.test"))
    assert answer.startswith(b"HTTP/1.1 403") and b"SECRET_MISDIRECTED" in answer
    assert x.upstream.heads == []


async def test_rotation_reaches_the_next_request_on_an_open_connection(rig) -> None:  # type: ignore[no-untyped-def]
    x = await rig("api.test")
    r, w = await asyncio.open_connection("127.0.0.1", x.port)
    w.write(get("/1"))
    await r.readuntil(b"0\r\n\r\n")
    x.view[0] = Secrets((API, OTHER), False, lambda b: b"rotated")
    w.write(get("/2"))
    await r.readuntil(b"0\r\n\r\n")
    w.close()
    assert [h["Authorization"] for h in x.upstream.heads] == [
        "Bearer the-real-value",
        "Bearer rotated",
    ]
    assert x.upstream.connections == 1


async def test_bodies_chunked_and_100_continue(rig) -> None:  # type: ignore[no-untyped-def]
    x = await rig("api.test")
    chunked = (
        b"POST /c HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: t\r\n\r\n"
    )
    body = b"z" * 300_000
    expect = (
        b"POST /e HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
        % len(body)
    )
    r, w = await asyncio.open_connection("127.0.0.1", x.port)
    w.write(chunked)
    await r.readuntil(b"0\r\n\r\n")
    w.write(expect)
    assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
    w.write(body)
    answer = await r.readuntil(b"0\r\n\r\n")
    w.close()
    assert b'{"n": 300000}' in answer
    assert x.upstream.bodies[0] == b"hello world"
    assert x.upstream.bodies[1] == body
    assert "Expect" not in x.upstream.heads[1]


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
        b"GET / HTTP/1.1\r\nNoColon\r\n\r\n",
        # A superscript two in latin-1: `str.isdigit()` says yes, `int()` says no.
        b"POST / HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n",
    ],
)
async def test_ambiguous_heads_refused(rig, request_bytes: bytes) -> None:  # type: ignore[no-untyped-def]
    x = await rig("api.test")
    (answer,) = await exchange(x.port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 400") and b"MALFORMED_REQUEST" in answer
    assert x.upstream.heads == []


async def test_value_that_cannot_be_read_sends_nothing(rig) -> None:  # type: ignore[no-untyped-def]
    x = await rig("api.test")
    gone = SecretBinding(name="GONE", hosts=("api.test",), placeholder=PH_API)
    x.view[0] = Secrets((gone,), False, value_of)
    (answer,) = await exchange(x.port, get("/", f"X: {PH_API}"))
    assert answer.startswith(b"HTTP/1.1 502") and b"SECRET_UNAVAILABLE" in answer
    assert x.upstream.heads == []


async def test_session_ca_issues_what_its_pem_verifies() -> None:
    ca = SessionCA("s1")
    server = await asyncio.start_server(
        lambda r, w: w.close(), "127.0.0.1", 0, ssl=ca.context("api.test")
    )
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cadata=ca.pem.decode())
    client.set_alpn_protocols(["h2", "http/1.1"])
    _, w = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="api.test")
    assert w.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
    w.close()
    with pytest.raises(ssl.SSLCertVerificationError):
        await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="other.test")
    other = ssl.create_default_context(cadata=SessionCA("s2").pem.decode())
    with pytest.raises(ssl.SSLCertVerificationError):
        await asyncio.open_connection("127.0.0.1", port, ssl=other, server_hostname="api.test")
    server.close()
    assert ca.context("api.test") is ca.context("api.test")  # cached


@pytest.mark.parametrize(
    "request_bytes",
    [
        # Domain fronting: TLS to the bound name, the request for another site on the same front.
        b"GET / HTTP/1.1\r\nHost: attacker.example\r\n\r\n",
        b"GET https://attacker.example/ HTTP/1.1\r\nHost: api.test\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: api.test\r\nHost: attacker.example\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: y\r\n\r\n",  # no Host at all
        b"GET / HTTP/1.1\r\nHost: api.test@attacker.example\r\n\r\n",
    ],
)
async def test_request_for_another_host_inside_the_tunnel_refused(
    rig, request_bytes: bytes
) -> None:  # type: ignore[no-untyped-def]
    x = await rig("api.test")
    (answer,) = await exchange(x.port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 421") and b"HOST_MISMATCH" in answer, answer
    assert x.upstream.heads == [] and x.events == []


async def test_host_spellings_of_the_bound_name_accepted(rig) -> None:  # type: ignore[no-untyped-def]
    x = await rig("api.test")
    await exchange(
        x.port,
        get("/1", host="API.test."),
        get("/2", host="api.test:443"),
        b"GET https://api.test:443/3 HTTP/1.1\r\nHost: api.test\r\n\r\n",
    )
    assert len(x.upstream.heads) == 3
    assert all(h["Authorization"] == "Bearer the-real-value" for h in x.upstream.heads)


@pytest.mark.parametrize(
    "status_and_length",
    [
        (b"200", b"x1"),
        (b"200", b"-1"),
        (b"200", b"1, 2"),
        (b"200", b"99999999999999999999"),
        (b"200", b"\xb2"),
        (b"\xb200", b"4"),
    ],
)
async def test_upstream_with_a_bad_status_or_content_length_is_a_framing_error(
    status_and_length: tuple[bytes, bytes],
) -> None:
    import socket

    from sandboxd.secrets.inject import HeadError

    async def pair() -> tuple[Any, Any, Any, Any]:
        a, b = socket.socketpair()
        ra, wa = await asyncio.open_connection(sock=a)
        rb, wb = await asyncio.open_connection(sock=b)
        return ra, wa, rb, wb

    client_r, client_w, sandbox_r, sandbox_w = await pair()
    up_r, up_w, origin_r, origin_w = await pair()
    relay = HttpRelay(
        "api.test", lambda: Secrets((API,), False, value_of), lambda *e: None, _send, 5
    )
    sandbox_w.write(get("/"))
    status, length = status_and_length
    origin_w.write(b"HTTP/1.1 %s OK\r\nContent-Length: %s\r\n\r\nbody" % (status, length))
    with pytest.raises(HeadError):
        await relay.run(client_r, client_w, up_r, up_w)
    for w in (client_w, sandbox_w, up_w, origin_w):
        w.close()


async def _send(w: asyncio.StreamWriter, data: bytes, way: str, counts: dict[str, int]) -> None:
    w.write(data)
    await w.drain()
