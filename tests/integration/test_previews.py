"""Previews end to end: a real server with its preview listener, real sandboxes own_server HTTP
(busybox httpd; python's stdlib for WebSocket, SSE, a silent port and a large download), and
real HTTP clients (http.client, aiohttp) on loopback. Two tenants: alice holds the operator's
`preview_public` grant, bob does not."""

# ruff: noqa: E501 (the sandbox's servers are one string of python with long lines)
from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import secrets
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import grpc
import pytest
from authutil import authed_stubs, write_tokens
from conftest import (
    ServerProcess,
    Stubs,
    error_info,
    make_stubs,
    own_server,
    remove_owned_containers,
    rss_bytes,
    start_server,
    wait_until,
)
from google.protobuf import duration_pb2
from sandboxd.v1 import (
    audit_pb2,
    audit_pb2_grpc,
    common_pb2,
    filesystem_pb2,
    previews_pb2,
    process_pb2,
    session_pb2,
)

PYTHON_IMAGE = "sandboxd-runtime:python"
DOMAIN = "preview.localhost"
TOKEN_ALICE = "alice-" + secrets.token_urlsafe(24)
TOKEN_BOB = "bob-" + secrets.token_urlsafe(24)

# The sandbox side: tiny servers in python's stdlib (the Debian image has no other).
SERVERS = r"""
import base64, hashlib, socket, sys, threading, time
mode, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port)); s.listen(16)

def head(c):
    data = b""
    while b"\r\n\r\n" not in data:
        more = c.recv(4096)
        if not more: return None, b""
        data += more
    h, _, rest = data.partition(b"\r\n\r\n")
    lines = h.decode().split("\r\n")
    return lines[0], {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}

def recv_exact(c, n):
    b = b""
    while len(b) < n:
        more = c.recv(n - len(b))
        if not more: raise EOFError
        b += more
    return b

def ws(c):
    line, h = head(c)
    key = h["sec-websocket-key"]
    acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Accept: " + acc + "\r\n\r\n").encode())
    while True:
        b0, b1 = recv_exact(c, 2)
        n = b1 & 127
        if n == 126: n = int.from_bytes(recv_exact(c, 2), "big")
        elif n == 127: n = int.from_bytes(recv_exact(c, 8), "big")
        mask = recv_exact(c, 4)
        data = bytes(x ^ mask[i % 4] for i, x in enumerate(recv_exact(c, n)))
        op = b0 & 15
        if op == 8:
            c.sendall(b"\x88\x00"); return
        hdr = bytes([0x80 | op])
        hdr += bytes([n]) if n < 126 else (bytes([126]) + n.to_bytes(2, "big") if n < 65536 else bytes([127]) + n.to_bytes(8, "big"))
        c.sendall(hdr + data)

def sse(c):
    line, h = head(c)
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
    for i in range(1000000):
        ev = ("id: %d\ndata: tick %d\n\n" % (i, i)).encode()
        c.sendall(b"%x\r\n%s\r\n" % (len(ev), ev))
        time.sleep(0.2 if i >= 3 else 0.05)

def silent(c):
    time.sleep(3600)

def big(c):
    line, h = head(c)
    n = int(line.split()[1].rsplit("/", 1)[1])
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % n)
    block = bytes(range(256)) * 256
    while n > 0:
        c.sendall(block[:n]); n -= len(block[:n])
    c.close()

def echo_headers(c):
    while True:
        line, h = head(c)
        if line is None: return
        body = (line + "\n" + "\n".join("%s: %s" % kv for kv in sorted(h.items()))).encode()
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

handler = {"ws": ws, "sse": sse, "silent": silent, "big": big, "echo": echo_headers}[mode]
while True:
    c, _ = s.accept()
    threading.Thread(target=lambda c=c: (handler(c), c.close()), daemon=True).start()
"""


@pytest.fixture(scope="module")
def preview_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("previews")
    tokens = write_tokens(
        data / "tokens",
        {TOKEN_ALICE: "alice", TOKEN_BOB: "bob"},
        {"alice": "preview_public"},
    )
    owner = "prev" + secrets.token_hex(4)
    with own_server(
        data / "data",
        owner,
        "--tokens-file",
        str(tokens),
        "--preview-listen",
        "127.0.0.1:0",
        "--preview-domain",
        DOMAIN,
        "--preview-timeout",
        "2s",
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def alice(preview_server: ServerProcess) -> Iterator[Stubs]:
    s = authed_stubs(preview_server.address, TOKEN_ALICE)
    yield s
    s.channel.close()


@pytest.fixture(scope="module")
def bob(preview_server: ServerProcess) -> Iterator[Stubs]:
    s = authed_stubs(preview_server.address, TOKEN_BOB)
    yield s
    s.channel.close()


def _session(stubs: Stubs, **fields: object) -> str:
    fields.setdefault("shell", common_pb2.ShellPolicy(allow_all=True))
    req = session_pb2.CreateSessionRequest(**fields)  # type: ignore[arg-type]
    return str(stubs.sessions.CreateSession(req).session.session_id)


def _start(stubs: Stubs, sid: str, *argv: str) -> None:
    stubs.processes.StartProcess(
        process_pb2.StartProcessRequest(
            session_id=sid, argv=list(argv), timeout=duration_pb2.Duration(seconds=3600)
        )
    )


def _publish(stubs: Stubs, sid: str, port: int, **fields: object) -> previews_pb2.Preview:
    req = previews_pb2.PublishPortRequest(session_id=sid, port=port, **fields)  # type: ignore[arg-type]
    return stubs.sessions.PublishPort(req).preview


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def _get(
    url: str, *, host: str | None = None, headers: dict[str, str] | None = None, path: str = ""
) -> Answer:
    """GET through the listener on loopback (a Host header stands in for wildcard DNS)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection("127.0.0.1", parts.port, timeout=30)
    try:
        target = path or (parts.path + (f"?{parts.query}" if parts.query else ""))
        conn.putrequest("GET", target, skip_host=True)
        conn.putheader("Host", host or str(parts.netloc))
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        r = conn.getresponse()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def _wait_serving(preview: previews_pb2.Preview, **kw: object) -> Answer:
    got: list[Answer] = []

    def up() -> bool:
        got.append(_get(preview.path_url, headers={"X-Sandboxd-Token": preview.token}, **kw))  # type: ignore[arg-type]
        return got[-1].status not in (502,)

    assert wait_until(up, timeout=20), got[-1]
    return got[-1]


@pytest.fixture(scope="module")
def httpd(alice: Stubs) -> Iterator[tuple[str, previews_pb2.Preview]]:
    sid = _session(alice)
    alice.files.WriteFile(
        filesystem_pb2.WriteFileRequest(
            session_id=sid,
            path="www/index.html",
            content=b"hello from busybox\n",
            make_parents=True,
        )
    )
    _start(alice, sid, "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/workspace/www")
    preview = _publish(alice, sid, 8080)
    _wait_serving(preview)
    yield sid, preview
    alice.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


def _loopback(url: str) -> str:
    """The path-routed URL on the listener's loopback address (no DNS for the domain here)."""
    parts = urlsplit(url)
    return parts._replace(netloc=f"127.0.0.1:{parts.port}").geturl()


def _python_image() -> bool:
    cp = subprocess.run(["docker", "image", "inspect", PYTHON_IMAGE], capture_output=True)
    return cp.returncode == 0


needs_python = pytest.mark.skipif(not _python_image(), reason=f"{PYTHON_IMAGE} not built")


def _python_session(stubs: Stubs, *modes: tuple[str, int], **fields: object) -> str:
    sid = _session(stubs, image=PYTHON_IMAGE, **fields)
    stubs.files.WriteFile(
        filesystem_pb2.WriteFileRequest(session_id=sid, path="srv.py", content=SERVERS.encode())
    )
    for mode, port in modes:
        _start(stubs, sid, "python3", "/workspace/srv.py", mode, str(port))
    return sid


# ----- routing ------------------------------------------------------------------------------


def test_busybox_httpd_by_path_and_by_host(httpd: tuple[str, previews_pb2.Preview]) -> None:
    sid, preview = httpd
    assert preview.url == f"http://8080-{sid}.{DOMAIN}:{urlsplit(preview.path_url).port}/"
    assert preview.path_url.endswith(f"/preview/{sid}/8080/")
    by_path = _get(preview.path_url, headers={"X-Sandboxd-Token": preview.token})
    assert by_path.status == 200 and by_path.body == b"hello from busybox\n"
    host = urlsplit(preview.url).netloc
    by_host = _get(
        preview.path_url, host=host, path="/", headers={"X-Sandboxd-Token": preview.token}
    )
    assert by_host.status == 200 and by_host.body == b"hello from busybox\n"
    missing = _get(preview.path_url + "nope.html", headers={"X-Sandboxd-Token": preview.token})
    assert missing.status == 404 and "x-sandboxd-refusal" not in missing.headers  # httpd's 404


def test_path_without_slash_redirects(httpd: tuple[str, previews_pb2.Preview]) -> None:
    _, preview = httpd
    r = _get(preview.path_url.rstrip("/"), headers={"X-Sandboxd-Token": preview.token})
    assert r.status == 308 and r.headers["location"] == urlsplit(preview.path_url).path


def test_query_token_once_then_cookie(httpd: tuple[str, previews_pb2.Preview]) -> None:
    sid, preview = httpd
    first = _get(preview.path_url + f"?sandboxd_token={preview.token}")
    assert first.status == 200
    cookie = first.headers["set-cookie"]
    assert f"Path=/preview/{sid}/8080/" in cookie and "HttpOnly" in cookie
    value = cookie.split(";", 1)[0]
    again = _get(preview.path_url, headers={"Cookie": value})
    assert again.status == 200 and again.body == b"hello from busybox\n"
    # Host-routed: the cookie is the host's (no Domain attribute: host-only), path /.
    host = urlsplit(preview.url).netloc
    hosted = _get(preview.path_url, host=host, path=f"/?sandboxd_token={preview.token}")
    assert hosted.status == 200 and "Path=/;" in hosted.headers["set-cookie"] + ";"
    assert "domain" not in hosted.headers["set-cookie"].lower()


@needs_python
def test_credentials_are_stripped_before_the_sandbox(alice: Stubs) -> None:
    sid = _python_session(alice, ("echo", 7000))
    try:
        p = _publish(alice, sid, 7000)
        seen = _wait_serving(p, path=urlsplit(p.path_url).path + "x?a=1&b=%20c")
        text = seen.body.decode()
        assert text.splitlines()[0] == "GET /x?a=1&b=%20c HTTP/1.1"
        assert p.token not in text and "x-sandboxd-token" not in text
        r = _get(
            p.path_url + f"y?sandboxd_token={p.token}&k=v",
            headers={"Cookie": f"theirs=1; sandboxd_preview={p.token}"},
        )
        first, *headers = r.body.decode().splitlines()
        assert first == "GET /y?k=v HTTP/1.1"
        assert "cookie: theirs=1" in headers and p.token not in r.body.decode()
    finally:
        alice.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


# ----- access -------------------------------------------------------------------------------


def _refusal(r: Answer) -> tuple[int, str]:
    return r.status, r.headers.get("x-sandboxd-refusal", "")


def test_missing_and_forged_tokens(httpd: tuple[str, previews_pb2.Preview]) -> None:
    _, p = httpd
    assert _refusal(_get(p.path_url)) == (401, "token_missing")
    body, mac = p.token.split(".")
    edited = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    edited[4] += 86400  # a longer life, same MAC
    forged_body = base64.urlsafe_b64encode(json.dumps(edited, separators=(",", ":")).encode())
    for token in (
        forged_body.decode().rstrip("=") + "." + mac,
        p.token[:-2] + ("AA" if not p.token.endswith("AA") else "BB"),
        "garbage",
        "",
    ):
        r = _get(p.path_url, headers={"X-Sandboxd-Token": token})
        assert _refusal(r) == (401, "token_missing" if not token else "token_forged"), token


def test_expired_token(alice: Stubs, httpd: tuple[str, previews_pb2.Preview]) -> None:
    sid, _ = httpd
    short = _publish(alice, sid, 8080, ttl=duration_pb2.Duration(seconds=1))
    assert _get(short.path_url, headers={"X-Sandboxd-Token": short.token}).status == 200
    time.sleep(2.1)
    r = _get(short.path_url, headers={"X-Sandboxd-Token": short.token})
    assert _refusal(r) == (401, "token_expired")
    # Leave the module's preview working: publish again (revoking the short one).
    fresh = _publish(alice, sid, 8080)
    assert _get(fresh.path_url, headers={"X-Sandboxd-Token": fresh.token}).status == 200


def test_revoked_by_republish_and_unpublish(alice: Stubs) -> None:
    sid = _session(alice)
    try:
        alice.files.WriteFile(
            filesystem_pb2.WriteFileRequest(
                session_id=sid, path="w/i.html", content=b"x", make_parents=True
            )
        )
        _start(alice, sid, "httpd", "-f", "-p", "127.0.0.1:9090", "-h", "/workspace/w")
        old = _publish(alice, sid, 9090)
        _wait_serving(old, path=urlsplit(old.path_url).path + "i.html")
        new = _publish(alice, sid, 9090)
        hdr = {"X-Sandboxd-Token": old.token}
        assert _refusal(_get(old.path_url + "i.html", headers=hdr)) == (401, "token_revoked")
        ok = _get(new.path_url + "i.html", headers={"X-Sandboxd-Token": new.token})
        assert ok.status == 200 and ok.body == b"x"
        alice.sessions.UnpublishPort(previews_pb2.UnpublishPortRequest(session_id=sid, port=9090))
        gone = _get(new.path_url + "i.html", headers={"X-Sandboxd-Token": new.token})
        assert _refusal(gone) == (404, "not_published")
        with pytest.raises(grpc.RpcError) as err:
            alice.sessions.UnpublishPort(
                previews_pb2.UnpublishPortRequest(session_id=sid, port=9090)
            )
        assert error_info(err.value).reason == "PORT_NOT_PUBLISHED"
    finally:
        alice.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


def test_cross_tenant_and_other_preview_tokens(
    alice: Stubs, bob: Stubs, httpd: tuple[str, previews_pb2.Preview]
) -> None:
    sid, p = httpd
    bob_sid = _session(bob)
    try:
        _start(bob, bob_sid, "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/workspace")
        bobs = _publish(bob, bob_sid, 8080)
        r = _get(p.path_url, headers={"X-Sandboxd-Token": bobs.token})
        assert _refusal(r) == (403, "token_other_tenant")
        # Bob cannot publish, unpublish or list alice's session: it answers as missing.
        for call in (
            lambda: _publish(bob, sid, 8080),
            lambda: bob.sessions.ListPorts(previews_pb2.ListPortsRequest(session_id=sid)),
            lambda: bob.sessions.UnpublishPort(
                previews_pb2.UnpublishPortRequest(session_id=sid, port=8080)
            ),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        # Alice's token of one port does not open her other port.
        other = _publish(alice, sid, 8081)
        r = _get(p.path_url, headers={"X-Sandboxd-Token": other.token})
        assert _refusal(r) == (403, "token_other_preview")
        alice.sessions.UnpublishPort(previews_pb2.UnpublishPortRequest(session_id=sid, port=8081))
    finally:
        bob.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=bob_sid))


def test_unpublished_port_and_nothing_listening(
    alice: Stubs, httpd: tuple[str, previews_pb2.Preview]
) -> None:
    sid, p = httpd
    never = p.path_url.replace("/8080/", "/8082/")
    assert _refusal(_get(never, headers={"X-Sandboxd-Token": p.token})) == (404, "not_published")
    empty = _publish(alice, sid, 8083)
    try:
        r = _get(empty.path_url, headers={"X-Sandboxd-Token": empty.token})
        assert _refusal(r) == (502, "sandbox_closed") and b"nothing listens" in r.body
    finally:
        alice.sessions.UnpublishPort(previews_pb2.UnpublishPortRequest(session_id=sid, port=8083))
    assert _refusal(_get(p.path_url.replace("/preview/", "/nope/"))) == (404, "not_a_preview")


def test_public_needs_the_grant(alice: Stubs, bob: Stubs) -> None:
    bob_sid = _session(bob)
    sid = _session(alice)
    try:
        with pytest.raises(grpc.RpcError) as err:
            _publish(bob, bob_sid, 8080, public=True)
        assert error_info(err.value).reason == "PREVIEW_PUBLIC_NOT_ALLOWED"
        _start(alice, sid, "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/workspace")
        pub = _publish(alice, sid, 8080, public=True)
        assert pub.public and pub.token == ""
        assert wait_until(lambda: _get(pub.path_url).status == 404, timeout=20)  # httpd answers
        listed = alice.sessions.ListPorts(previews_pb2.ListPortsRequest(session_id=sid)).previews
        assert [(x.port, x.public, x.token) for x in listed] == [(8080, True, "")]
    finally:
        bob.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=bob_sid))
        alice.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


def test_bad_publish_requests(alice: Stubs, httpd: tuple[str, previews_pb2.Preview]) -> None:
    sid, _ = httpd
    for fields, reason in (
        ({"port": 0}, "PREVIEW_PORT_INVALID"),
        ({"port": 70000}, "PREVIEW_PORT_INVALID"),
        ({"port": 80, "ttl": duration_pb2.Duration(seconds=10**8)}, "PREVIEW_TTL_INVALID"),
    ):
        with pytest.raises(grpc.RpcError) as err:
            alice.sessions.PublishPort(previews_pb2.PublishPortRequest(session_id=sid, **fields))  # type: ignore[arg-type]
        assert error_info(err.value).reason == reason, fields
    listed = alice.sessions.ListPorts(previews_pb2.ListPortsRequest(session_id=sid)).previews
    assert [x.port for x in listed] == [8080] and all(not x.token for x in listed)


# ----- streams ------------------------------------------------------------------------------


@needs_python
def test_websocket_echo_and_sse(alice: Stubs) -> None:
    sid = _python_session(alice, ("ws", 7001), ("sse", 7002))
    try:
        ws = _publish(alice, sid, 7001)
        sse = _publish(alice, sid, 7002)
        _wait_listening(alice, sid, 7001)
        _wait_listening(alice, sid, 7002)

        async def go() -> tuple[list[str], list[bytes], list[str]]:
            hdr = {"X-Sandboxd-Token": ws.token}
            async with aiohttp.ClientSession() as http_client:
                async with http_client.ws_connect(_loopback(ws.path_url), headers=hdr) as conn:
                    texts = []
                    for text in ("one", "two" * 1000):
                        await conn.send_str(text)
                        texts.append((await conn.receive(timeout=10)).data)
                    blobs = []
                    big = secrets.token_bytes(200_000)
                    await conn.send_bytes(big)
                    blobs.append((await conn.receive(timeout=10)).data)
                events = []
                hdr = {"X-Sandboxd-Token": sse.token}
                async with http_client.get(_loopback(sse.path_url), headers=hdr) as r:
                    assert r.headers["Content-Type"] == "text/event-stream"
                    async for line in r.content:
                        if line.startswith(b"data:"):
                            events.append(line.decode().strip())
                        if len(events) == 3:
                            break
            return texts, blobs, events

        texts, blobs, events = asyncio.run(go())
        assert texts == ["one", "two" * 1000]
        assert len(blobs[0]) == 200_000
        assert events == ["data: tick 0", "data: tick 1", "data: tick 2"]
    finally:
        alice.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


# What runs in the sandbox: each process's argv, as JSON lines (the image has no `ps`).
LIST_PROCESSES = (
    "import json, os\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        argv = open('/proc/%s/cmdline' % pid, 'rb').read().split(b'\\0')[:-1]\n"
    "    except OSError:\n"
    "        continue\n"
    "    print(json.dumps([a.decode(errors='replace') for a in argv]))\n"
)


def _processes(stubs: Stubs, sid: str) -> list[list[str]]:
    r = stubs.processes.Run(
        process_pb2.RunRequest(session_id=sid, argv=["python3", "-c", LIST_PROCESSES])
    )
    assert r.exit_code == 0, r.stderr
    return [json.loads(line) for line in r.stdout.decode().splitlines() if line]


@needs_python
def test_an_agent_sandbox_relays_without_a_process_per_connection(alice: Stubs) -> None:
    """The agent dials the port itself (its channel's `dial` streams): while a preview streams,
    no `sbx dial` runs in the sandbox (it did when previews ran one over an exec)."""
    sid = _python_session(alice, ("sse", 7006))
    try:
        p = _publish(alice, sid, 7006)
        _wait_listening(alice, sid, 7006)

        async def go() -> tuple[list[list[str]], int]:
            hdr = {"X-Sandboxd-Token": p.token}
            events, during = 0, []
            async with aiohttp.ClientSession() as http_client:
                async with http_client.get(_loopback(p.path_url), headers=hdr) as r:
                    async for line in r.content:
                        events += line.startswith(b"data:")
                        if events == 2:  # the preview's connection is open and streaming
                            during = await asyncio.to_thread(_processes, alice, sid)
                        if events == 4:  # and still is after the look
                            break
            return during, events

        during, events = asyncio.run(go())
        assert events == 4
        assert any("/workspace/srv.py" in argv for argv in during), during  # a real listing
        dials = [argv for argv in during if len(argv) > 1 and argv[1] == "dial"]
        assert dials == [], dials
    finally:
        alice.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


def test_without_an_agent_previews_keep_sbx_dial(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """`agent = false`: no channel, so a preview runs `sbx dial` over a docker exec; answers
    and the 502 of a port nothing listens on are the same."""
    data = tmp_path_factory.mktemp("noagent")
    owner = "preva" + secrets.token_hex(3)
    srv = start_server(data, owner, "--preview-listen", "127.0.0.1:0", "--agent", "false")
    try:
        stubs = make_stubs(srv.address)
        sid = _session(stubs)
        stubs.files.WriteFile(
            filesystem_pb2.WriteFileRequest(session_id=sid, path="index.html", content=b"exec\n")
        )
        _start(stubs, sid, "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/workspace")
        p = _publish(stubs, sid, 8080)
        answer = _wait_serving(p)
        assert answer.status == 200 and answer.body == b"exec\n"
        empty = _publish(stubs, sid, 8083)
        r = _get(empty.path_url, headers={"X-Sandboxd-Token": empty.token})
        assert _refusal(r) == (502, "sandbox_closed") and b"nothing listens" in r.body
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
        stubs.channel.close()
    finally:
        srv.stop()
        remove_owned_containers(owner)


def _wait_listening(stubs: Stubs, sid: str, port: int) -> None:
    script = (
        "import socket,sys\ntry:\n"
        f" socket.create_connection(('127.0.0.1',{port}),1)\nexcept OSError:\n sys.exit(1)\n"
    )

    def up() -> bool:
        r = stubs.processes.Run(
            process_pb2.RunRequest(session_id=sid, argv=["python3", "-c", script])
        )
        return r.exit_code == 0

    assert wait_until(up, timeout=20)


@needs_python
def test_silent_sandbox_times_out_cleanly(alice: Stubs) -> None:
    sid = _python_session(alice, ("silent", 7003))
    try:
        p = _publish(alice, sid, 7003)
        _wait_listening(alice, sid, 7003)
        started = time.monotonic()
        r = _get(p.path_url, headers={"X-Sandboxd-Token": p.token})
        assert _refusal(r) == (504, "sandbox_timeout")
        assert 1.5 < time.monotonic() - started < 10
    finally:
        alice.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


@needs_python
def test_slow_client_does_not_hold_server_memory(
    alice: Stubs, preview_server: ServerProcess
) -> None:
    """A client that reads nothing of a 256 MiB answer: the server holds a few buffers of it,
    not the answer (the relay reads from the sandbox only after the client took the last)."""
    sid = _python_session(alice, ("big", 7004))
    try:
        p = _publish(alice, sid, 7004)
        _wait_listening(alice, sid, 7004)
        size = 256 * 1024 * 1024
        before = rss_bytes(preview_server.proc.pid) // 1024
        port = urlsplit(p.path_url).port
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            path = urlsplit(p.path_url).path
            request = f"GET {path}{size} HTTP/1.1\r\nHost: x\r\nX-Sandboxd-Token: {p.token}\r\n\r\n"
            s.sendall(request.encode())
            time.sleep(4)  # the sandbox would have sent it all by now, had nobody pushed back
            grown = rss_bytes(preview_server.proc.pid) // 1024 - before
            assert grown < 32 * 1024, f"server grew {grown} KiB for a client reading nothing"
            got = 0
            s.settimeout(30)
            while got < 1024 * 1024:  # the stream still flows once the client reads
                chunk = s.recv(65536)
                assert chunk
                got += len(chunk)
    finally:
        alice.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


# ----- the session's end --------------------------------------------------------------------


@needs_python
def test_deleting_the_session_closes_its_previews(alice: Stubs) -> None:
    sid = _python_session(alice, ("sse", 7005))
    p = _publish(alice, sid, 7005)
    _wait_listening(alice, sid, 7005)

    async def go() -> tuple[int, float]:
        hdr = {"X-Sandboxd-Token": p.token}
        lines = 0
        async with aiohttp.ClientSession() as http_client:
            async with http_client.get(_loopback(p.path_url), headers=hdr) as r:
                deleted_at = 0.0
                try:
                    async for line in r.content:
                        lines += line.startswith(b"data:")
                        if lines == 2 and not deleted_at:
                            await asyncio.to_thread(
                                alice.sessions.DeleteSession,
                                session_pb2.DeleteSessionRequest(session_id=sid),
                            )
                            deleted_at = time.monotonic()
                except aiohttp.ClientPayloadError:
                    pass  # cut mid-chunk: the stream ended, which is the point
        return lines, time.monotonic() - deleted_at

    lines, after = asyncio.run(go())
    assert lines >= 2 and after < 5
    assert _refusal(_get(p.path_url, headers={"X-Sandboxd-Token": p.token})) == (
        404,
        "not_published",
    )


# ----- the clients --------------------------------------------------------------------------


def test_python_client_and_sandboxctl(
    preview_server: ServerProcess, httpd: tuple[str, previews_pb2.Preview]
) -> None:
    from sandboxd_client import Preview, SandboxClient
    from sandboxd_client.errors import SandboxError

    sid, _ = httpd

    async def go() -> tuple[Preview, list[Preview], str]:
        async with SandboxClient(preview_server.address, token=TOKEN_ALICE, timeout=30) as c:
            p = await c.publish_port(sid, 8080, ttl=600)
            listed = [x async for x in c.list_ports(sid)]
            await c.publish_port(sid, 8084)
            await c.unpublish_port(sid, 8084)
            try:
                await c.unpublish_port(sid, 8084)
                reason = ""
            except SandboxError as exc:
                reason = exc.reason
            return p, listed, reason

    p, listed, reason = asyncio.run(go())
    assert isinstance(p, Preview) and p.expires_at is not None and p.token
    assert _get(p.path_url, headers=p.headers).body == b"hello from busybox\n"
    assert [(x.port, x.token) for x in listed] == [(8080, "")]
    assert reason == "PORT_NOT_PUBLISHED"

    ctl = [sys.executable, "-m", "sandboxd_client.cli", "--addr", preview_server.address]
    env = {**os.environ, "SANDBOXD_TOKEN": TOKEN_ALICE}
    out = subprocess.run(
        [*ctl, "-o", "json", "publish", sid, "8085"], capture_output=True, env=env, check=True
    )
    published = json.loads(out.stdout)
    assert published["port"] == 8085 and published["token"]
    ports = subprocess.run([*ctl, "ports", sid], capture_output=True, env=env, check=True)
    assert b"8085" in ports.stdout and published["token"].encode() not in ports.stdout
    subprocess.run([*ctl, "unpublish", sid, "8085"], env=env, check=True)
    again = subprocess.run([*ctl, "unpublish", sid, "8085"], capture_output=True, env=env)
    assert again.returncode != 0 and b"PORT_NOT_PUBLISHED" in again.stderr


# ----- accounting and restarts --------------------------------------------------------------


def test_preview_requests_are_audited(
    alice: Stubs, httpd: tuple[str, previews_pb2.Preview]
) -> None:
    sid, _ = httpd
    fresh = _publish(alice, sid, 8080)
    hdr = {"X-Sandboxd-Token": fresh.token}
    assert _get(fresh.path_url + "?q=secret", headers=hdr).status == 200
    assert _get(fresh.path_url).status == 401
    audit = audit_pb2_grpc.AuditServiceStub(alice.channel)
    events = audit.ListAuditEvents(
        audit_pb2.ListAuditEventsRequest(session_id=sid, kinds=["preview"])
    ).events
    statuses = [e.attributes["status"] for e in events]
    assert "200" in statuses and "401" in statuses
    assert all(e.tenant == "alice" and e.attributes["port"].isdigit() for e in events)
    assert any(e.attributes["port"] == "8080" and e.attributes["status"] == "200" for e in events)
    assert all("secret" not in e.attributes["path"] for e in events)  # no query, no token


def test_published_ports_and_tokens_survive_a_restart(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    data = tmp_path_factory.mktemp("restart")
    owner = "prevr" + secrets.token_hex(3)
    flags = ("--preview-listen", "127.0.0.1:0")
    first = start_server(data, owner, *flags)
    try:
        stubs = make_stubs(first.address)
        sid = _session(stubs)
        _start(stubs, sid, "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/workspace")
        p = _publish(stubs, sid, 8080)
        _wait_serving(p)
        stubs.channel.close()
        assert first.stop() == 0, first.log()

        second = start_server(data, owner, *flags)
        try:
            stubs = make_stubs(second.address)
            _start(stubs, sid, "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/workspace")
            listed = stubs.sessions.ListPorts(previews_pb2.ListPortsRequest(session_id=sid))
            [again] = listed.previews
            assert again.port == 8080 and again.expires_at == p.expires_at
            moved = previews_pb2.Preview(path_url=again.path_url, token=p.token)
            answer = _wait_serving(moved)  # httpd's own 404 (no index): the old token opens
            assert answer.status == 404 and "x-sandboxd-refusal" not in answer.headers
            stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
            stubs.channel.close()
        finally:
            second.stop()
    finally:
        first.stop()
        remove_owned_containers(owner)


def test_the_listener_speaks_tls_with_the_servers_certificate(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from authutil import Pki

    data = tmp_path_factory.mktemp("tlsprev")
    pki = Pki(data, "prev")
    tokens = write_tokens(data / "tokens", {TOKEN_ALICE: "alice"})
    owner = "prevt" + secrets.token_hex(3)
    srv = start_server(
        data / "data",
        owner,
        *("--tokens-file", str(tokens), "--preview-listen", "127.0.0.1:0"),
        *("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)),
    )
    try:
        creds = grpc.ssl_channel_credentials(pki.ca_pem)
        stubs = authed_stubs(srv.address, TOKEN_ALICE, credentials=creds)
        sid = _session(stubs)
        stubs.files.WriteFile(
            filesystem_pb2.WriteFileRequest(session_id=sid, path="index.html", content=b"tls\n")
        )
        _start(stubs, sid, "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/workspace")
        p = _publish(stubs, sid, 8080)
        assert p.path_url.startswith("https://")
        port = urlsplit(p.path_url).port
        ctx = ssl.create_default_context(cafile=str(pki.ca_path))
        answers: list[tuple[int, bytes, str]] = []

        def fetch() -> bool:
            conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)
            try:
                conn.request("GET", urlsplit(p.path_url).path + f"?sandboxd_token={p.token}")
                r = conn.getresponse()
                answers.append((r.status, r.read(), r.getheader("Set-Cookie") or ""))
            finally:
                conn.close()
            return answers[-1][0] == 200

        assert wait_until(fetch, timeout=20), answers[-1]
        assert answers[-1][1] == b"tls\n" and "Secure" in answers[-1][2]
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            plain.request("GET", "/")
            plain.getresponse().read()
        plain.close()
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
        stubs.channel.close()
    finally:
        srv.stop()
        remove_owned_containers(owner)
