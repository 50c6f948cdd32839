"""The web gateway (web_listen): the API over Connect and gRPC-Web, answered by the gRPC server.

Real `buf curl` in both protocols, a server-streaming Exec a web page can follow as it runs, and
each of the gateway's refusals (SECURITY.md, "Web gateway"): the tokens of the gRPC port, CORS,
the request size cap, methods it does not carry, bodies it cannot read.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import secrets
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from authutil import write_tokens
from conftest import ServerProcess, remove_owned_containers, start_server
from sandboxd.v1 import process_pb2

REPO = Path(__file__).resolve().parents[2]
BUF = REPO / "clients" / "node" / "node_modules" / ".bin" / "buf"
TOKEN = "web-" + secrets.token_urlsafe(24)
ORIGIN = "https://app.example.test"
MAX_BODY = 64 * 1024
IDLE = 3
_WEB_RE = re.compile(r"web gateway \(Connect, gRPC-Web\) at http://[\d.]+:(\d+)")


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    data = tmp_path_factory.mktemp("web")
    tokens = write_tokens(data / "tokens", {TOKEN: "webber"})
    owner = "web" + secrets.token_hex(4)
    srv = start_server(
        data / "data",
        owner,
        "--tokens-file",
        str(tokens),
        "--web-listen",
        "127.0.0.1:0",
        "--web-allowed-origins",
        ORIGIN,
        "--web-max-request-bytes",
        str(MAX_BODY),
        "--web-idle-timeout",
        f"{IDLE}s",
    )
    try:
        found = [_WEB_RE.search(line) for line in srv.log_lines]
        port = next(int(m.group(1)) for m in found if m)
        yield srv, port
    finally:
        srv.stop()
        remove_owned_containers(owner)


def _buf(port: int, protocol: str, path: str, body: dict[str, object], token: str | None = TOKEN):
    if not BUF.exists():
        pytest.skip("buf is installed by `make node-deps` (clients/node/node_modules)")
    auth = ["-H", f"Authorization: Bearer {token}"] if token else []
    return subprocess.run(
        [
            str(BUF),
            "curl",
            "--protocol",
            protocol,
            "--schema",
            str(REPO / "proto"),
            *auth,
            "-d",
            json.dumps(body),
            f"http://127.0.0.1:{port}/{path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )


def _post(
    port: int, path: str, body: bytes, content_type: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body, {"Content-Type": content_type, **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _session(port: int) -> str:
    made = _buf(
        port,
        "connect",
        "sandboxd.v1.SessionService/CreateSession",
        {"shell": {"allow": ["sh", "echo", "sleep", "ps"]}},
    )
    assert made.returncode == 0, made.stderr
    return str(json.loads(made.stdout)["session"]["sessionId"])


def _ps(port: int, sid: str) -> str:
    ran = _buf(
        port, "connect", "sandboxd.v1.ProcessService/Run", {"sessionId": sid, "argv": ["ps"]}
    )
    assert ran.returncode == 0, ran.stderr
    return base64.b64decode(json.loads(ran.stdout).get("stdout", "")).decode()


@pytest.mark.parametrize("protocol", ["connect", "grpcweb"])
def test_buf_curl_calls_unary_and_streams_exec(
    web: tuple[ServerProcess, int], protocol: str
) -> None:
    _, port = web
    info = _buf(port, protocol, "sandboxd.v1.AdminService/GetServerInfo", {})
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["version"]
    sid = _session(port)
    try:
        ran = _buf(
            port,
            protocol,
            "sandboxd.v1.ProcessService/Exec",
            {"sessionId": sid, "argv": ["sh", "-c", "echo one; echo two >&2; exit 3"]},
        )
        assert ran.returncode == 0, ran.stderr
        events = [json.loads(m) for m in re.findall(r"^\{.*?^\}", ran.stdout, re.M | re.S)]
        assert "started" in events[0]
        outputs = [(e["output"]["stream"], e["output"]["data"]) for e in events if "output" in e]
        assert ("OUTPUT_STREAM_STDOUT", "b25lCg==") in outputs  # "one\n"
        assert ("OUTPUT_STREAM_STDERR", "dHdvCg==") in outputs  # "two\n"
        assert events[-1]["exited"]["exitCode"] == 3
        # A refusal is the server's own: its code and its ErrorInfo reason, in either protocol.
        missing = _buf(
            port, protocol, "sandboxd.v1.SessionService/GetSession", {"sessionId": "s-nope"}
        )
        assert missing.returncode != 0
        err = json.loads(missing.stderr)
        assert err["code"] == "not_found" and err["details"][0]["type"] == "google.rpc.ErrorInfo"
    finally:
        _buf(port, "connect", "sandboxd.v1.SessionService/DeleteSession", {"sessionId": sid})


def test_a_web_page_follows_exec_output_as_it_comes(web: tuple[ServerProcess, int]) -> None:
    """gRPC-Web as a browser's fetch makes it: the first output arrives while the command still
    runs (it then sleeps for minutes), and leaving the response ends the call."""
    _, port = web
    sid = _session(port)
    try:
        req = process_pb2.ExecRequest(session_id=sid, argv=["sh", "-c", "echo first; sleep 300"])
        payload = req.SerializeToString()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request(
            "POST",
            "/sandboxd.v1.ProcessService/Exec",
            struct.pack(">BI", 0, len(payload)) + payload,
            {
                "Content-Type": "application/grpc-web+proto",
                "Authorization": f"Bearer {TOKEN}",
                "Origin": ORIGIN,
                "X-Grpc-Web": "1",
            },
        )
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Access-Control-Allow-Origin") == ORIGIN
        seen: list[process_pb2.ExecResponse] = []
        started = time.monotonic()
        while not any(e.HasField("output") for e in seen):
            flags, length = struct.unpack(">BI", resp.read(5))
            assert flags == 0, "the stream ended before any output"
            seen.append(process_pb2.ExecResponse.FromString(resp.read(length)))
        assert time.monotonic() - started < 300  # it came while the command ran
        out = next(e.output for e in seen if e.HasField("output"))
        assert out.data == b"first\n"
        assert "sleep 300" in _ps(port, sid)  # still running while the page reads
        conn.close()
        # The page went away: the call is cancelled, and the server ends the command.
        for _ in range(60):
            if "sleep 300" not in _ps(port, sid):
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the command outlived the page that ran it")
    finally:
        _buf(port, "connect", "sandboxd.v1.SessionService/DeleteSession", {"sessionId": sid})


def test_the_grpc_ports_tokens_hold(web: tuple[ServerProcess, int]) -> None:
    _, port = web
    path = "sandboxd.v1.SessionService/ListSessions"
    for token in (None, "wrong-" + secrets.token_urlsafe(8)):
        for protocol in ("connect", "grpcweb"):
            refused = _buf(port, protocol, path, {}, token=token)
            assert refused.returncode != 0
            err = json.loads(refused.stderr)
            assert err["code"] == "unauthenticated", err
    status, _, body = _post(port, "/" + path, b"{}", "application/json")
    assert status == 401 and json.loads(body)["code"] == "unauthenticated"


def test_cors_answers_only_the_allowed_origin(web: tuple[ServerProcess, int]) -> None:
    _, port = web
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(
        "OPTIONS",
        "/sandboxd.v1.ProcessService/Exec",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
    )
    pre = conn.getresponse()
    pre.read()
    assert pre.status == 204
    assert pre.getheader("Access-Control-Allow-Origin") == ORIGIN
    assert "authorization" in (pre.getheader("Access-Control-Allow-Headers") or "")
    conn.close()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    path = "/sandboxd.v1.AdminService/GetServerInfo"
    status, headers, _ = _post(
        port, path, b"{}", "application/json", {**auth, "Origin": "https://evil.example.test"}
    )
    assert status == 403 and "access-control-allow-origin" not in headers
    status, headers, _ = _post(port, path, b"{}", "application/json", {**auth, "Origin": ORIGIN})
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN


def test_refusals_of_the_gateway_itself(web: tuple[ServerProcess, int]) -> None:
    _, port = web
    auth = {"Authorization": f"Bearer {TOKEN}"}
    # over the size cap: refused from its Content-Length, before the body is read
    status, _, _ = _post(
        port,
        "/sandboxd.v1.AdminService/GetServerInfo",
        b"x" * (MAX_BODY + 1),
        "application/proto",
        auth,
    )
    assert status == 413
    # a client-streaming method is not carried (no request stream over HTTP/1.1)
    status, _, body = _post(
        port, "/sandboxd.v1.FilesystemService/WriteFileStream", b"{}", "application/json", auth
    )
    assert status == 501 and json.loads(body)["code"] == "unimplemented"
    status, _, body = _post(port, "/sandboxd.v1.NoService/Nothing", b"{}", "application/json", auth)
    assert status == 501
    # not a protocol spoken here, and a body that is not the method's message
    status, _, _ = _post(port, "/sandboxd.v1.AdminService/GetServerInfo", b"{}", "text/plain", auth)
    assert status == 415
    status, _, body = _post(
        port, "/sandboxd.v1.AdminService/GetServerInfo", b'{"nope": 1}', "application/json", auth
    )
    assert status == 400 and json.loads(body)["code"] == "invalid_argument"
    # a gRPC-Web envelope that claims more than the cap
    status, _, body = _post(
        port,
        "/sandboxd.v1.AdminService/GetServerInfo",
        struct.pack(">BI", 0, 1 << 30),
        "application/grpc-web+proto",
        auth,
    )
    assert status == 200 and b"grpc-status: 3" in body


def test_a_connection_that_never_finishes_its_request_is_closed(
    web: tuple[ServerProcess, int],
) -> None:
    """A request head begun and never ended, or a body promised and never sent, holds its
    connection for web_idle_timeout at most (here 3 s; the socket would wait 60). The three
    connections are held at the same time, each timed from its own opening."""
    _, port = web

    def held_for(opening: bytes) -> float:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(opening)
            started = time.monotonic()
            while sock.recv(4096):  # a 408 may come first; then the close
                pass
            return time.monotonic() - started

    openings = (
        b"POST /sandboxd.v1.AdminService/GetServerInfo HTTP/1.1\r\nHost: a\r\n",
        b"POST /sandboxd.v1.AdminService/GetServerInfo HTTP/1.1\r\nHost: a\r\n"
        b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        b"",
    )
    with ThreadPoolExecutor(len(openings)) as pool:
        for held in pool.map(held_for, openings):
            assert held < 50


def test_calls_past_web_max_calls_are_refused_at_once(tmp_path: Path) -> None:
    """With web_max_calls 1, a second call while a stream is open is resource_exhausted
    without waiting, and is served again once the stream ends."""
    owner = "webcap" + secrets.token_hex(4)
    srv = start_server(
        tmp_path / "data", owner, "--web-listen", "127.0.0.1:0", "--web-max-calls", "1"
    )
    try:
        port = next(int(m.group(1)) for m in map(_WEB_RE.search, srv.log_lines) if m)
        info = "/sandboxd.v1.AdminService/GetServerInfo"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = b'{"shell": {"allow": ["sleep"]}}'
        status, _, made = _post(
            port, "/sandboxd.v1.SessionService/CreateSession", body, "application/json"
        )
        assert status == 200, made
        sid = json.loads(made)["session"]["sessionId"]
        req = process_pb2.ExecRequest(session_id=sid, argv=["sleep", "300"]).SerializeToString()
        conn.request(
            "POST",
            "/sandboxd.v1.ProcessService/Exec",
            struct.pack(">BI", 0, len(req)) + req,
            {"Content-Type": "application/grpc-web+proto"},
        )
        resp = conn.getresponse()
        assert resp.status == 200
        flags, length = struct.unpack(">BI", resp.read(5))  # Started: the call holds the slot
        resp.read(length)
        status, _, refused = _post(port, info, b"{}", "application/json")
        assert status == 429 and json.loads(refused)["code"] == "resource_exhausted"
        conn.close()
        for _ in range(60):
            status, _, _ = _post(port, info, b"{}", "application/json")
            if status == 200:
                break
            time.sleep(0.5)
        assert status == 200
    finally:
        srv.stop()
        remove_owned_containers(owner)
