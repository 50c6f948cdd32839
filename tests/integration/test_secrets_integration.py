"""Secrets injected by the egress proxy, end to end: a real server, the Debian python image in
the sandbox (urllib), and an HTTPS upstream with its own test CA reached the way
test_egress_integration reaches its upstreams (a relay container on the default bridge,
names mapped with SANDBOXD_PROXY_HOSTS). Traffic stays on this host and the test's containers.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import secrets
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import (
    IMAGE,
    ServerProcess,
    Stubs,
    expect_error,
    make_stubs,
    remove_owned_containers,
    run,
    start_server,
    wait_until,
)
from google.protobuf import duration_pb2
from sandboxd.profile import container_name
from sandboxd.v1 import (
    common_pb2,
    filesystem_pb2,
    secrets_pb2,
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
)
from test_egress_integration import (
    PYTHON_IMAGE,
    Threaded,
    assert_no_owned_networks,
    bridge_gateway,
    relay,
    serving,
)
from testcerts import CertAuthority

ALLOWLIST = common_pb2.NETWORK_MODE_ALLOWLIST
TENANT = "default"  # no tokens file


class Recorder:
    """What the upstream received: (connection id, path, headers) per request."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, str, dict[str, str]]] = []
        self.lock = threading.Lock()

    def of(self, path: str) -> list[tuple[int, str, dict[str, str]]]:
        with self.lock:
            return [r for r in self.requests if r[1] == path]


class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    recorder = Recorder()

    def _answer(self, extra: bytes = b"") -> None:
        with self.recorder.lock:
            self.recorder.requests.append((id(self.connection), self.path, dict(self.headers)))
        body = json.dumps({"path": self.path, "headers": dict(self.headers)}).encode() + extra
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self._answer()

    def do_POST(self) -> None:  # noqa: N802
        left = int(self.headers.get("Content-Length", "0"))
        while left:
            left -= len(self.rfile.read(min(left, 1 << 20)))
        self._answer()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One HTTPS listener: api.test and other.test under the test CA, bad.test (by SNI) under
    a CA nobody trusts."""
    folder = tmp_path_factory.mktemp("upstream")
    ca, rogue = CertAuthority.create("sandboxd test CA"), CertAuthority.create("rogue CA")
    good_ctx = ca.server_context(folder, "api.test", "other.test")
    bad_ctx = rogue.server_context(folder, "bad.test")

    def sni(sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        if name == "bad.test":
            sock.context = bad_ctx

    good_ctx.sni_callback = sni  # type: ignore[assignment]
    (folder / "ca.pem").write_bytes(ca.pem)
    recorder = Recorder()
    handler = type("Rec", (Upstream,), {"recorder": recorder})
    gateway = bridge_gateway()
    server = Threaded((gateway, 0), handler)
    server.socket = good_ctx.wrap_socket(server.socket, server_side=True)
    with serving(server) as port, relay(gateway, [port]) as address:
        yield {"port": port, "relay": address, "ca_file": folder / "ca.pem", "rec": recorder}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


REF_VALUE = "ref-" + secrets.token_hex(16)


def server_env(upstream: dict[str, Any], conf: Path) -> dict[str, str]:
    (conf / "secrets").write_text(f"# operator secrets\n{TENANT}/other-key {REF_VALUE}\n")
    hosts = ",".join(f"{h}={upstream['relay']}" for h in ("api.test", "other.test", "bad.test"))
    return {
        "SANDBOXD_PROXY_HOSTS": hosts,
        "SANDBOXD_EGRESS_PRIVATE_NETWORKS": "allow",
        "SANDBOXD_EGRESS_UPSTREAM_CA_FILE": str(upstream["ca_file"]),
        "SANDBOXD_SECRETS_FILE": str(conf / "secrets"),
    }


@pytest.fixture(scope="module")
def secrets_server(
    tmp_path_factory: pytest.TempPathFactory, upstream: dict[str, Any]
) -> Iterator[tuple[ServerProcess, str]]:
    owner = "sec" + secrets.token_hex(4)
    metrics = f"127.0.0.1:{_free_port()}"
    env = server_env(upstream, tmp_path_factory.mktemp("secrets-conf"))
    srv = start_server(
        tmp_path_factory.mktemp("secrets-data"),
        owner,
        env={**env, "SANDBOXD_METRICS_LISTEN": metrics},
    )
    yield srv, metrics
    srv.stop()
    remove_owned_containers(owner)
    assert_no_owned_networks(owner)


@pytest.fixture(scope="module")
def sstubs(secrets_server: tuple[ServerProcess, str]) -> Iterator[Stubs]:
    s = make_stubs(secrets_server[0].address)
    yield s
    s.channel.close()


def policy(port: int, value: str, *, refuse: bool = False, **more: Any) -> common_pb2.NetworkPolicy:
    return common_pb2.NetworkPolicy(
        mode=ALLOWLIST,
        allowed_domains=["api.test", "other.test", "bad.test"],
        allowed_ports=[port],
        allow_private_networks=True,
        refuse_misdirected_secrets=refuse,
        secrets=[
            secrets_pb2.SecretBinding(
                name="API_KEY",
                value=value.encode(),
                hosts=["api.test"],
                header="Authorization",
                template="Bearer {secret}",
            ),
            secrets_pb2.SecretBinding(
                name="OTHER_KEY", secret_ref="other-key", hosts=["other.test"]
            ),
            secrets_pb2.SecretBinding(
                name="BAD_KEY",
                value=b"never-sent",
                hosts=["bad.test"],
                header="X-K",
                template="{secret}",
            ),
        ],
        **more,
    )


@pytest.fixture
def make_session(sstubs: Stubs) -> Iterator[Any]:
    created: list[str] = []

    def make(network: common_pb2.NetworkPolicy) -> session_pb2.Session:
        resp = sstubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(
                shell=common_pb2.ShellPolicy(allow_all=True), network=network, image=PYTHON_IMAGE
            )
        )
        created.append(resp.session.session_id)
        return resp.session

    yield make
    for sid in created:
        with contextlib.suppress(grpc.RpcError):
            sstubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


# Run in the sandbox: GET each URL (with headers built from the environment), print JSON.
CLIENT = r"""
import json, os, sys, urllib.request
out = []
for url, headers in json.loads(sys.argv[1]):
    headers = {k: os.path.expandvars(v) for k, v in headers.items()}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20) as r:
            out.append({"status": r.status, "body": json.loads(r.read())})
    except Exception as e:
        out.append({"status": 0, "error": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
"""


def fetch(stubs: Stubs, sid: str, calls: list[tuple[str, dict[str, str]]]) -> list[dict[str, Any]]:
    r = run(
        stubs, sid, "python3", "-c", CLIENT, json.dumps(calls),
        timeout=duration_pb2.Duration(seconds=60),
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr.decode()
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def events(stubs: Stubs, sid: str) -> list[session_pb2.EgressEvent]:
    return list(
        stubs.sessions.ListEgressEvents(
            session_pb2.ListEgressEventsRequest(session_id=sid, page_size=1000)
        ).events
    )


def test_injected_for_bound_hosts_placeholder_elsewhere_audited(
    sstubs: Stubs, make_session: Any, upstream: dict[str, Any]
) -> None:
    port, value = upstream["port"], "val-" + secrets.token_hex(16)
    s = make_session(policy(port, value))
    sid = s.session_id
    env = dict(
        line.split("=", 1)
        for line in run(sstubs, sid, "env").stdout.decode().splitlines()
        if "=" in line
    )
    api_ph, other_ph = env["API_KEY"], env["OTHER_KEY"]
    assert api_ph.startswith("sbx_secret_") and other_ph.startswith("sbx_secret_")
    assert env["SSL_CERT_FILE"] == "/etc/ssl/sandboxd/ca-bundle.crt"
    for key in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"):
        assert env[key].startswith("/etc/ssl/sandboxd/")
    out = fetch(
        sstubs,
        sid,
        [
            (f"https://api.test:{port}/api", {"Authorization": "Bearer $API_KEY"}),
            (f"https://other.test:{port}/other", {"X-Api": "key=$OTHER_KEY"}),
            (f"https://other.test:{port}/leak", {"X-Leak": "$API_KEY"}),
        ],
    )
    assert [o["status"] for o in out] == [200, 200, 200], out
    # The upstream got the values; the sandbox's answers show what the upstream saw.
    assert upstream["rec"].of("/api")[-1][2]["Authorization"] == f"Bearer {value}"
    assert upstream["rec"].of("/other")[-1][2]["X-Api"] == f"key={REF_VALUE}"
    # Sent to a host it is not bound to: never replaced, audited with the name, no value.
    assert upstream["rec"].of("/leak")[-1][2]["X-Leak"] == api_ph
    evs = events(sstubs, sid)
    injected = [(e.host, e.secret) for e in evs if e.kind == "secret_injected"]
    assert ("api.test", "API_KEY") in injected and ("other.test", "OTHER_KEY") in injected
    mis = [e for e in evs if e.kind == "secret_misdirected"]
    assert [(e.host, e.secret) for e in mis] == [("other.test", "API_KEY")]
    # GetSession: the bindings without values.
    got = sstubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=sid)).session
    assert [b.name for b in got.network.secrets] == ["API_KEY", "BAD_KEY", "OTHER_KEY"]
    assert value.encode() not in got.SerializeToString()
    assert all(not b.value for b in got.network.secrets)
    # Every file readable in the sandbox, and its environment: the placeholders only.
    scan = run(
        sstubs, sid, "python3", "-c", SCAN, api_ph,
        stdin=json.dumps([value, REF_VALUE]).encode(),
        timeout=duration_pb2.Duration(seconds=120),
    )  # fmt: skip
    assert scan.exit_code == 0, scan.stderr.decode()[-2000:]
    report = json.loads(scan.stdout)
    assert report["hits"] == [] and report["files"] > 1000, report
    assert report["placeholder_in"], report  # the scan does see the environment


SCAN = r"""
import json, os, sys
# From stdin: in argv they would be in this process's own /proc/self/cmdline.
values = [v.encode() for v in json.loads(sys.stdin.read())]
placeholder = sys.argv[1].encode()
hits, files, placeholder_in = [], 0, []
def check(path):
    global files
    try:
        with open(path, "rb") as f:
            data = f.read(64 << 20)
    except OSError:
        return
    files += 1
    if any(v in data for v in values):
        hits.append(path)
    if placeholder in data:
        placeholder_in.append(path)
for root, dirs, names in os.walk("/"):
    if root in ("/proc", "/sys", "/dev"):
        dirs[:] = []
        continue
    for n in names:
        p = os.path.join(root, n)
        if os.path.isfile(p) and not os.path.islink(p):
            check(p)
for p in ("/proc/self/environ", "/proc/1/environ", "/proc/self/cmdline"):
    check(p)
print(json.dumps({"hits": hits, "files": files, "placeholder_in": placeholder_in}))
"""


def test_upstream_certificate_not_verified_is_refused(
    sstubs: Stubs, make_session: Any, upstream: dict[str, Any]
) -> None:
    port = upstream["port"]
    s = make_session(policy(port, "v-" + secrets.token_hex(8)))
    before = len(upstream["rec"].requests)
    out = fetch(sstubs, s.session_id, [(f"https://bad.test:{port}/bad", {})])
    assert out[0]["status"] == 0 and "502" in out[0]["error"], out
    assert len(upstream["rec"].requests) == before  # nothing was sent to it
    refused = [e for e in events(sstubs, s.session_id) if e.reason == "UPSTREAM_CERT_INVALID"]
    assert refused and refused[0].host == "bad.test"
    # The reply names the reason (what a client that reads the CONNECT answer sees).
    raw = run(sstubs, s.session_id, "python3", "-c", RAW_CONNECT, f"bad.test:{port}")
    assert b"UPSTREAM_CERT_INVALID" in raw.stdout and b"does not verify" in raw.stdout


RAW_CONNECT = r"""
import os, socket, sys
host, port = os.environ["HTTPS_PROXY"][len("http://"):].rsplit(":", 1)
s = socket.create_connection((host, int(port)))
s.sendall(f"CONNECT {sys.argv[1]} HTTP/1.1\r\nHost: {sys.argv[1]}\r\n\r\n".encode())
print(s.recv(4096).decode(errors="replace"))
"""


def test_refuse_misdirected_option(
    sstubs: Stubs, make_session: Any, upstream: dict[str, Any]
) -> None:
    port = upstream["port"]
    s = make_session(policy(port, "v-" + secrets.token_hex(8), refuse=True))
    before = len(upstream["rec"].of("/leak2"))
    out = fetch(
        sstubs, s.session_id, [(f"https://other.test:{port}/leak2", {"X-Leak": "$API_KEY"})]
    )
    assert "403" in out[0].get("error", ""), out
    assert len(upstream["rec"].of("/leak2")) == before
    assert [e.secret for e in events(sstubs, s.session_id) if e.kind == "secret_misdirected"] == [
        "API_KEY"
    ]


# One keep-alive connection: a request, wait for /workspace/go, a second request.
KEEPALIVE = r"""
import http.client, os, ssl, time
host, port = os.environ["HTTPS_PROXY"][len("http://"):].rsplit(":", 1)
conn = http.client.HTTPSConnection(host, int(port), context=ssl.create_default_context())
conn.set_tunnel("api.test", int(os.environ["UP_PORT"]))
for path in ("/k1", "/k2"):
    conn.request("GET", path)
    r = conn.getresponse()
    r.read()
    print(path, r.status, flush=True)
    while path == "/k1" and not os.path.exists("/workspace/go"):
        time.sleep(0.05)
"""


def test_rotation_with_a_keepalive_connection_open(
    sstubs: Stubs, make_session: Any, upstream: dict[str, Any]
) -> None:
    port = upstream["port"]
    old, new = "old-" + secrets.token_hex(8), "new-" + secrets.token_hex(8)
    s = make_session(policy(port, old))
    sid = s.session_id
    result: dict[str, Any] = {}

    def client() -> None:
        result["r"] = run(
            sstubs, sid, "python3", "-c", KEEPALIVE, env={"UP_PORT": str(port)},
            timeout=duration_pb2.Duration(seconds=60),
        )  # fmt: skip

    thread = threading.Thread(target=client)
    thread.start()
    try:
        assert wait_until(lambda: bool(upstream["rec"].of("/k1")), 30)
        # Rotate API_KEY only; OTHER_KEY and BAD_KEY, sent without a source, keep theirs.
        rotated = policy(port, new)
        del rotated.secrets[1:]
        rotated.secrets.add(name="OTHER_KEY", hosts=["other.test"])
        rotated.secrets.add(name="BAD_KEY", hosts=["bad.test"], header="X-K", template="{secret}")
        answer = sstubs.sessions.UpdateNetworkPolicy(
            session_pb2.UpdateNetworkPolicyRequest(session_id=sid, network=rotated)
        )
        assert new.encode() not in answer.SerializeToString()
        assert [b.name for b in answer.session.network.secrets] == [
            "API_KEY",
            "BAD_KEY",
            "OTHER_KEY",
        ]
        sstubs.files.WriteFile(
            filesystem_pb2.WriteFileRequest(session_id=sid, path="go", content=b"1")
        )
    finally:
        thread.join(60)
    assert result["r"].exit_code == 0, result["r"].stderr
    (c1, _, h1), (c2, _, h2) = upstream["rec"].of("/k1")[-1], upstream["rec"].of("/k2")[-1]
    assert c1 == c2, "both requests came over one upstream connection"
    assert h1["Authorization"] == f"Bearer {old}" and h2["Authorization"] == f"Bearer {new}"
    # The ref binding sent without a source kept it.
    out = fetch(sstubs, sid, [(f"https://other.test:{port}/after", {"X-Api": "$OTHER_KEY"})])
    assert out[0]["status"] == 200 and upstream["rec"].of("/after")[-1][2]["X-Api"] == REF_VALUE


def test_bad_bindings_refused(sstubs: Stubs, upstream: dict[str, Any]) -> None:
    port = upstream["port"]

    def create(p: common_pb2.NetworkPolicy) -> object:
        return sstubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(network=p, image=PYTHON_IMAGE)
        )

    p = policy(port, "x")
    p.secrets[0].hosts.append("evil.test")  # not allowed
    expect_error(lambda: create(p), grpc.StatusCode.INVALID_ARGUMENT, "SECRET_BINDING_INVALID")
    p = policy(port, "x")
    p.secrets[1].secret_ref = "missing"
    expect_error(lambda: create(p), grpc.StatusCode.INVALID_ARGUMENT, "SECRET_REF_NOT_FOUND")
    p = policy(port, "a\r\nX-Evil: 1")
    err = expect_error(
        lambda: create(p), grpc.StatusCode.INVALID_ARGUMENT, "SECRET_BINDING_INVALID"
    )
    assert "X-Evil" not in err.details()  # type: ignore[attr-defined]


def test_redaction_through_a_whole_life(
    sstubs: Stubs,
    make_session: Any,
    upstream: dict[str, Any],
    secrets_server: tuple[ServerProcess, str],
) -> None:
    """create, inject, snapshot, export, suspend, resume, inject, delete: then the value is
    in no log line, no file of the data directory, no snapshot, archive or metric."""
    srv, metrics = secrets_server
    port, value = upstream["port"], "redact-" + secrets.token_hex(16)
    s = make_session(policy(port, value))
    sid = s.session_id
    call = [(f"https://api.test:{port}/life", {})]
    assert fetch(sstubs, sid, call)[0]["status"] == 200
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(sstubs.channel)
    snap = snaps.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(session_id=sid)).snapshot
    archive = b"".join(
        c.chunk.data for c in snaps.ExportArchive(snapshot_pb2.ExportArchiveRequest(session_id=sid))
    )
    downloaded = b"".join(
        c.chunk.data
        for c in snaps.DownloadSnapshot(
            snapshot_pb2.DownloadSnapshotRequest(snapshot_id=snap.snapshot_id)
        )
    )
    inspect = subprocess.run(
        ["docker", "inspect", container_name(srv.owner_id, sid)],
        capture_output=True,
        check=False,
    ).stdout
    sstubs.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=sid))
    sstubs.sessions.ResumeSession(session_pb2.ResumeSessionRequest(session_id=sid))
    # The sealed value survived the suspension (same server run).
    assert fetch(sstubs, sid, call)[0]["status"] == 200
    assert upstream["rec"].of("/life")[-1][2]["Authorization"] == f"Bearer {value}"
    listed = sstubs.sessions.ListSessions(session_pb2.ListSessionsRequest()).SerializeToString()
    sstubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as r:
        metrics_text = r.read()
    assert b"sandboxd_secret_events_total" in metrics_text and b"secret_injected" in metrics_text
    time.sleep(0.5)  # the last log lines
    needle = value.encode()
    assert needle not in "".join(srv.log_lines).encode()
    assert any("secret_injected API_KEY" in line for line in srv.log_lines)
    for blob in (archive, downloaded, inspect, listed, metrics_text):
        assert needle not in blob
    files = [p for p in Path(srv.data_dir).rglob("*") if p.is_file()]
    assert files
    for p in files:
        assert needle not in p.read_bytes(), p


def test_live_session_cannot_gain_a_secret(
    sstubs: Stubs, make_session: Any, upstream: dict[str, Any]
) -> None:
    port = upstream["port"]
    s = make_session(policy(port, "x" * 8))
    p = policy(port, "y" * 8)
    p.secrets.add(name="NEW_KEY", value=b"z", hosts=["api.test"])
    expect_error(
        lambda: sstubs.sessions.UpdateNetworkPolicy(
            session_pb2.UpdateNetworkPolicyRequest(session_id=s.session_id, network=p)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "SECRET_BINDING_INVALID",
    )


@pytest.mark.parametrize("key_file", [True, False])
def test_restart_new_ca_installed_inline_values_need_the_key_file(
    tmp_path: Path, upstream: dict[str, Any], key_file: bool
) -> None:
    """After a restart the proxy draws a new CA and writes it into the running sandbox; inline
    values open again only with secrets_key_file (else a clear 502, and refs still work)."""
    owner = "sec" + secrets.token_hex(4)
    env = server_env(upstream, tmp_path)
    if key_file:
        (tmp_path / "key").write_text(secrets.token_hex(32))
        env["SANDBOXD_SECRETS_KEY_FILE"] = str(tmp_path / "key")
    data = tmp_path / "data"
    data.mkdir()
    port, value = upstream["port"], "restart-" + secrets.token_hex(8)
    calls = [
        (f"https://api.test:{port}/r-api", {}),
        (f"https://other.test:{port}/r-ref", {"X-Api": "$OTHER_KEY"}),
    ]
    srv = start_server(data, owner, env=env)
    try:
        stubs = make_stubs(srv.address)
        s = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(
                shell=common_pb2.ShellPolicy(allow_all=True),
                network=policy(port, value),
                image=PYTHON_IMAGE,
            )
        ).session
        assert [o["status"] for o in fetch(stubs, s.session_id, calls)] == [200, 200]
        stubs.channel.close()
        srv.stop()
        srv = start_server(data, owner, env=env)
        stubs = make_stubs(srv.address)
        assert wait_until(lambda: "egress proxy of" in srv.log(), 20)
        sent = len(upstream["rec"].of("/r-api"))
        out = fetch(stubs, s.session_id, calls)
        assert out[1]["status"] == 200, out  # the new CA is trusted in the sandbox
        assert upstream["rec"].of("/r-ref")[-1][2]["X-Api"] == REF_VALUE
        if key_file:
            assert out[0]["status"] == 200, out
            assert upstream["rec"].of("/r-api")[-1][2]["Authorization"] == f"Bearer {value}"
        else:
            assert out[0]["status"] == 502 or "502" in out[0].get("error", ""), out
            assert len(upstream["rec"].of("/r-api")) == sent  # nothing sent after the restart
        assert value not in "".join(srv.log_lines)
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=s.session_id))
        stubs.channel.close()
    finally:
        srv.stop()
        remove_owned_containers(owner)
        assert_no_owned_networks(owner)


@pytest.mark.parametrize("image", [IMAGE, PYTHON_IMAGE])
def test_trust_bundle_read_only_to_the_sandbox(
    sstubs: Stubs, upstream: dict[str, Any], image: str
) -> None:
    s = sstubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            shell=common_pb2.ShellPolicy(allow_all=True),
            network=policy(upstream["port"], "v-" + secrets.token_hex(8)),
            image=image,
        )
    ).session
    try:
        sid = s.session_id
        bundle = run(sstubs, sid, "cat", "/etc/ssl/sandboxd/ca-bundle.crt").stdout
        ca = run(sstubs, sid, "cat", "/etc/ssl/sandboxd/session-ca.crt").stdout
        assert ca.startswith(b"-----BEGIN CERTIFICATE-----") and bundle.endswith(ca)
        roots = bundle.count(b"BEGIN CERTIFICATE")
        # busybox has no roots of its own; Debian's are kept in front of the session CA.
        assert roots == 1 if image == IMAGE else roots > 50
        touched = run(sstubs, sid, "sh", "-c", "echo x > /etc/ssl/sandboxd/ca-bundle.crt")
        assert touched.exit_code != 0
        assert run(sstubs, sid, "cat", "/etc/ssl/sandboxd/ca-bundle.crt").stdout == bundle
    finally:
        sstubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=s.session_id))
