"""The egress allowlist end to end: real containers with no network interface but loopback
(network mode none), the agent inside each carrying every connection to its loopback proxy
port over the channel to the proxy in a real server process, upstreams this test runs (names
mapped with SANDBOXD_PROXY_HOSTS).

The proxy never dials the host itself, whatever the grant (tests/integration/
test_hostile_egress.py), so the upstreams are reached through a relay container on Docker's
default bridge: a private address, which the server (egress_private_networks=allow) lets
sessions that ask reach; the relay forwards each port to the test's listeners on the bridge's
gateway. Nothing here sends traffic anywhere but this host and the test's own containers."""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import os
import secrets
import socket
import socketserver
import ssl
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import (
    IMAGE,
    ServerProcess,
    Stubs,
    expect_error,
    make_stubs,
    own_server,
    remove_owned_containers,
    run,
    start_server,
    wait_until,
)
from containers import docker, session_containers
from google.protobuf import duration_pb2
from sandboxd.v1 import admin_pb2, common_pb2, session_pb2

PYTHON_IMAGE = "sandboxd-runtime:python"
ALLOWLIST = common_pb2.NETWORK_MODE_ALLOWLIST


class Counting:
    """Counts accepted connections, so a test can say "no connection was attempted"."""

    connections = 0


class EchoHandler(socketserver.BaseRequestHandler):
    counter = Counting()

    def handle(self) -> None:
        self.counter.connections += 1
        data = self.request.recv(4096)
        self.request.sendall(b"ECHO:" + data)


class StreamEchoHandler(socketserver.BaseRequestHandler):
    """Echoes everything until the client's end (bulk transfers both ways)."""

    def handle(self) -> None:
        while data := self.request.recv(1 << 16):
            self.request.sendall(data)


class HelloHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = f"hello from {self.path} host={self.headers.get('Host')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class Threaded(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextlib.contextmanager
def serving(server: socketserver.BaseServer) -> Iterator[int]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]  # type: ignore[misc]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


RELAY = """
import asyncio, sys

async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
        w.write_eof()
    except (OSError, RuntimeError):
        pass

async def main(target, ports):
    async def serve(port):
        async def handle(cr, cw):
            try:
                ur, uw = await asyncio.open_connection(target, port)
            except OSError:
                cw.close()
                return
            await asyncio.gather(pipe(cr, uw), pipe(ur, cw))
            cw.close()
            uw.close()
        return await asyncio.start_server(handle, "0.0.0.0", port)
    servers = [await serve(p) for p in ports]
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))

asyncio.run(main(sys.argv[1], [int(p) for p in sys.argv[2:]]))
"""


def bridge_gateway() -> str:
    """The host's address on Docker's default bridge (its interface, e.g. docker0)."""
    bridge = docker(
        "network", "inspect", "-f", '{{index .Options "com.docker.network.bridge.name"}}', "bridge"
    ).strip()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("256s", bridge.encode()[:15])
        answer = fcntl.ioctl(s.fileno(), 0x8915, request)  # SIOCGIFADDR
    return socket.inet_ntoa(answer[20:24])


@contextlib.contextmanager
def relay(target: str, ports: list[int]) -> Iterator[str]:
    """A container on the default bridge forwarding `ports` to `target`; yields its address."""
    name = "sandboxd-test-relay-" + secrets.token_hex(4)
    docker(
        "run", "-d", "--rm", "--name", name, "--network", "bridge", "--entrypoint", "python3",
        PYTHON_IMAGE, "-c", RELAY, target, *map(str, ports),
    )  # fmt: skip
    try:
        assert wait_until(lambda: "ready" in docker("logs", name), 30), docker("logs", name)
        yield docker(
            "inspect", "-f", "{{.NetworkSettings.Networks.bridge.IPAddress}}", name
        ).strip()
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """Echo, HTTP and HTTPS listeners on the default bridge's gateway, reached through a relay
    container, with a CA the containers can trust."""
    certs = tmp_path_factory.mktemp("certs")
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=tls.test", "-addext", "subjectAltName=DNS:tls.test",
            "-keyout", str(certs / "key.pem"), "-out", str(certs / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs / "cert.pem", certs / "key.pem")
    counter = Counting()
    handler = type("Echo", (EchoHandler,), {"counter": counter})
    gateway = bridge_gateway()
    https = Threaded((gateway, 0), HelloHandler)
    https.socket = ctx.wrap_socket(https.socket, server_side=True)
    with (
        serving(Threaded((gateway, 0), handler)) as echo_port,
        serving(Threaded((gateway, 0), HelloHandler)) as http_port,
        serving(https) as https_port,
        serving(Threaded((gateway, 0), StreamEchoHandler)) as stream_port,
        relay(gateway, [echo_port, http_port, https_port, stream_port]) as relay_address,
    ):
        yield {
            "echo": echo_port,
            "http": http_port,
            "https": https_port,
            "stream": stream_port,
            "counter": counter,
            "ca": (certs / "cert.pem").read_bytes(),
            "relay": relay_address,
        }


# Names of the upstreams; RELAY_ADDRESS is replaced by the relay container's address.
HOSTS = ",".join(
    [
        "up.test=RELAY_ADDRESS",
        "tls.test=RELAY_ADDRESS",
        "a.wild.test=RELAY_ADDRESS",
        "loop.test=127.0.0.1",
        "loop6.test=::1",
        "private.test=10.0.0.1",
        "meta.test=169.254.169.254",
        "linklocal.test=169.254.1.1",
        "mapped.test=::ffff:127.0.0.1",
    ]
)


def server_env(upstreams: dict[str, object]) -> dict[str, str]:
    return {
        "SANDBOXD_PROXY_HOSTS": HOSTS.replace("RELAY_ADDRESS", str(upstreams["relay"])),
        "SANDBOXD_EGRESS_PRIVATE_NETWORKS": "allow",
    }


# Every test on egress_server runs on runc and gVisor sessions (conftest's `tier`: skipped
# where runsc is not registered): both have only loopback, egress over the agent's channel.
TIERS = ("runc", "gvisor")


@pytest.fixture(scope="module")
def egress_server(
    tmp_path_factory: pytest.TempPathFactory, upstreams: dict[str, object], tier: str
) -> Iterator[ServerProcess]:
    owner = "egr" + secrets.token_hex(4)
    extra = ("--isolation-default", tier) if tier != "runc" else ()
    with own_server(
        tmp_path_factory.mktemp("egress"), owner, *extra, env=server_env(upstreams)
    ) as srv:
        yield srv
    assert_no_owned_networks(owner)


def owned_networks(owner_id: str) -> list[str]:
    return subprocess.run(
        ["docker", "network", "ls", "-q", "--filter", f"label=io.sandboxd.owner={owner_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def assert_no_owned_networks(owner_id: str) -> None:
    """Sessions have no networks: no network ever carries a test server's labels."""
    assert owned_networks(owner_id) == []


def assert_loopback_only(stubs: Stubs, sid: str) -> None:
    """`ip link` in the session shows only `lo`; the engine says network mode none."""
    links = run(stubs, sid, "ip", "-o", "link").stdout.decode()
    assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"], links
    assert run(stubs, sid, "ls", "/sys/class/net").stdout.decode().split() == ["lo"]
    cid = container_of(stubs, sid)
    mode = docker("inspect", "-f", "{{.HostConfig.NetworkMode}}", cid).strip()
    assert mode == "none"


def container_of(stubs: Stubs, sid: str) -> str:
    return "\n".join(session_containers(sid, running=True))


@pytest.fixture(scope="module")
def estubs(egress_server: ServerProcess) -> Iterator[Stubs]:
    s = make_stubs(egress_server.address)
    yield s
    s.channel.close()


def allowlist(
    domains: list[str], ports: list[int], private: bool, **quotas: object
) -> common_pb2.NetworkPolicy:
    return common_pb2.NetworkPolicy(
        mode=ALLOWLIST,
        allowed_domains=domains,
        allowed_ports=ports,
        allow_private_networks=private,
        quotas=common_pb2.ProxyQuotas(**quotas),  # type: ignore[arg-type]
    )


@pytest.fixture
def session_with(estubs: Stubs) -> Iterator[object]:
    created: list[str] = []

    def make(network: common_pb2.NetworkPolicy, image: str = IMAGE) -> session_pb2.Session:
        resp = estubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(
                shell=common_pb2.ShellPolicy(allow_all=True), network=network, image=image
            )
        )
        created.append(resp.session.session_id)
        return resp.session

    yield make
    for sid in created:
        with contextlib.suppress(grpc.RpcError):
            estubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


# Sends $PAYLOAD (printf %b escapes) to the proxy named by $HTTP_PROXY, prints the answer.
NC = 'P=${HTTP_PROXY#http://}; printf "%b" "$PAYLOAD" | nc -w 5 "${P%:*}" "${P#*:}"'


def through_proxy(stubs: Stubs, sid: str, payload: str) -> str:
    r = run(stubs, sid, "sh", "-c", NC, env={"PAYLOAD": payload}, timeout=_secs(20))
    return r.stdout.decode(errors="replace")


def _secs(n: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=n)


def connect(host: str, port: int, extra: str = "") -> str:
    return f"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n{extra}"


def test_allowed_name_and_port_tunnel(estubs: Stubs, session_with, upstreams) -> None:  # type: ignore[no-untyped-def]
    echo, http_port = upstreams["echo"], upstreams["http"]
    s = session_with(allowlist(["up.test", "*.wild.test"], [echo, http_port], private=True))
    env = run(estubs, s.session_id, "env").stdout.decode()
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY"):
        assert f"{key}=" in env
    out = through_proxy(estubs, s.session_id, connect("UP.test.", echo, "hello"))
    assert out.startswith("HTTP/1.1 200") and out.endswith("ECHO:hello"), out
    out = through_proxy(estubs, s.session_id, connect("a.wild.test", echo, "w"))
    assert out.endswith("ECHO:w"), out
    out = through_proxy(
        estubs,
        s.session_id,
        f"GET http://up.test:{http_port}/plain HTTP/1.1\\r\\nProxy-Connection: x\\r\\n\\r\\n",
    )
    assert out.startswith("HTTP/1.0 200") and out.endswith(
        f"hello from /plain host=up.test:{http_port}"
    ), out
    events = estubs.sessions.ListEgressEvents(
        session_pb2.ListEgressEventsRequest(session_id=s.session_id)
    ).events
    assert [e.verdict for e in events] == [session_pb2.EGRESS_VERDICT_ALLOWED] * 3
    assert events[0].host == "up.test" and events[0].bytes_up == 5
    from sandboxd.v1 import events_pb2

    stats = estubs.sessions.GetSessionStats(
        events_pb2.GetSessionStatsRequest(session_id=s.session_id)
    ).stats
    moved = sum(e.bytes_up + e.bytes_down for e in events)
    assert stats.egress_bytes >= moved > 0  # what the proxy carried (no interface to count)


def test_a_large_tunnel_keeps_every_byte(estubs: Stubs, session_with, upstreams) -> None:  # type: ignore[no-untyped-def]
    """Megabytes each way through the agent's channel (flow control on every hop): every byte
    echoed back, counted by the audit."""
    echo, size = upstreams["stream"], 6 * 1024 * 1024
    s = session_with(allowlist(["up.test"], [echo], private=True))
    script = (
        'P=${HTTP_PROXY#http://}; (printf "%b" "$PAYLOAD"; head -c $SIZE /dev/urandom) '
        '| nc -w 10 "${P%:*}" "${P#*:}" | wc -c'
    )
    r = run(
        estubs,
        s.session_id,
        "sh",
        "-c",
        script,
        env={"PAYLOAD": connect("up.test", echo), "SIZE": str(size)},
        timeout=_secs(60),
    )
    head = len(b"HTTP/1.1 200 Connection Established\r\n\r\n")
    assert int(r.stdout.decode().strip() or 0) == head + size, r.stderr

    def ended() -> list[session_pb2.EgressEvent]:
        events = estubs.sessions.ListEgressEvents(
            session_pb2.ListEgressEventsRequest(session_id=s.session_id)
        ).events
        return [e for e in events if e.bytes_up or e.bytes_down]

    assert wait_until(lambda: bool(ended()), 10)
    assert (ended()[-1].bytes_up, ended()[-1].bytes_down) == (size, size)


def test_refusals_make_no_connection(estubs: Stubs, session_with, upstreams) -> None:  # type: ignore[no-untyped-def]
    echo = upstreams["echo"]
    counter = upstreams["counter"]
    s = session_with(allowlist(["up.test"], [echo], private=True))
    before = counter.connections
    cases = [
        (connect("other.test", echo), "NAME_NOT_ALLOWED"),
        (connect("wild.test", echo), "NAME_NOT_ALLOWED"),
        (connect("up.test", echo + 1), "PORT_NOT_ALLOWED"),
        (connect("127.0.0.1", echo), "IP_LITERAL"),
        (connect("127.1", echo), "IP_LITERAL"),
        (connect("2130706433", echo), "IP_LITERAL"),
        (connect("0x7f000001", echo), "IP_LITERAL"),
        (connect("[::ffff:7f00:1]", echo), "IP_LITERAL"),
        (f"GET http://127.0.0.1:{echo}/ HTTP/1.1\\r\\n\\r\\n", "IP_LITERAL"),
        (f"CONNECT up.test:{echo} HTTP/1.1\\n\\n", "MALFORMED_REQUEST"),
    ]
    for payload, reason in cases:
        out = through_proxy(estubs, s.session_id, payload)
        assert f"X-Sandboxd-Egress-Reason: {reason}" in out, (payload, out)
        assert "Connection: close" in out
    assert counter.connections == before


def test_refused_answers_without_private_networks(estubs: Stubs, session_with, upstreams) -> None:  # type: ignore[no-untyped-def]
    echo, counter = upstreams["echo"], upstreams["counter"]
    names = [
        "loop.test",
        "loop6.test",
        "private.test",
        "meta.test",
        "linklocal.test",
        "mapped.test",
    ]
    s = session_with(allowlist(names, [echo], private=False))
    before = counter.connections
    for name in names:
        out = through_proxy(estubs, s.session_id, connect(name, echo))
        assert out.startswith("HTTP/1.1 403"), (name, out)
        assert "ADDRESS_REFUSED" in out, (name, out)
    assert counter.connections == before
    events = estubs.sessions.ListEgressEvents(
        session_pb2.ListEgressEventsRequest(session_id=s.session_id, page_size=2)
    )
    assert len(events.events) == 2 and events.next_page_token
    assert events.events[0].reason == "ADDRESS_REFUSED"
    assert events.events[0].address == "127.0.0.1"


def test_connection_quota(estubs: Stubs, session_with, upstreams) -> None:  # type: ignore[no-untyped-def]
    echo = upstreams["echo"]
    s = session_with(allowlist(["up.test"], [echo], private=True, max_connections=1))
    script = (
        'P=${HTTP_PROXY#http://}; (printf "%b" "$PAYLOAD"; sleep 3) | nc "${P%:*}" "${P#*:}" '
        '>/dev/null & sleep 1; printf "%b" "$PAYLOAD" | nc -w 5 "${P%:*}" "${P#*:}"; wait'
    )
    r = run(estubs, s.session_id, "sh", "-c", script, env={"PAYLOAD": connect("up.test", echo)})
    out = r.stdout.decode()
    assert out.startswith("HTTP/1.1 429") and "QUOTA_CONNECTIONS" in out, out


def test_direct_socket_to_another_host_port_fails(estubs: Stubs, session_with, upstreams) -> None:  # type: ignore[no-untyped-def]
    s = session_with(allowlist(["up.test"], [upstreams["echo"]], private=True))
    proxy = run(estubs, s.session_id, "sh", "-c", "echo ${HTTP_PROXY#http://}").stdout.decode()
    assert proxy.strip() == "127.0.0.1:3128"  # the agent's listener, on the sandbox's loopback
    assert_loopback_only(estubs, s.session_id)
    gateway = bridge_gateway()  # an address of this host (docker0): no route there at all
    with socket.create_server((gateway, 0)) as listener:
        listener.settimeout(0.1)
        port = listener.getsockname()[1]
        r = run(estubs, s.session_id, "sh", "-c", f"echo hi | nc -w 2 {gateway} {port}")
        assert r.exit_code != 0
        with pytest.raises(TimeoutError):
            listener.accept()
    # the echo upstream on 127.0.0.1 (through the gateway's host) is not reachable either
    r = run(estubs, s.session_id, "sh", "-c", f"echo hi | nc -w 2 {gateway} {upstreams['echo']}")
    assert "ECHO" not in r.stdout.decode()


def test_a_deny_session_has_no_listener_and_no_interface(estubs: Stubs, session_with) -> None:  # type: ignore[no-untyped-def]
    s = session_with(common_pb2.NetworkPolicy(mode=common_pb2.NETWORK_MODE_DENY))
    assert_loopback_only(estubs, s.session_id)
    env = run(estubs, s.session_id, "env").stdout.decode()
    assert "HTTP_PROXY=" not in env and "https_proxy=" not in env
    probe = 'printf "CONNECT up.test:80 HTTP/1.1\\r\\n\\r\\n" | nc -w 2 127.0.0.1 3128'
    r = run(estubs, s.session_id, "sh", "-c", probe)
    assert r.exit_code != 0 and not r.stdout, r  # nothing listens: no egress at all


def test_update_network_policy(estubs: Stubs, session_with, upstreams) -> None:  # type: ignore[no-untyped-def]
    echo = upstreams["echo"]
    s = session_with(allowlist(["up.test"], [echo], private=True))
    assert through_proxy(estubs, s.session_id, connect("up.test", echo, "a")).endswith("ECHO:a")
    updated = estubs.sessions.UpdateNetworkPolicy(
        session_pb2.UpdateNetworkPolicyRequest(
            session_id=s.session_id, network=allowlist(["a.wild.test"], [echo], private=True)
        )
    ).session
    assert updated.fingerprint != s.fingerprint
    assert list(updated.network.allowed_domains) == ["a.wild.test"]
    got = estubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=s.session_id))
    assert got.session.fingerprint == updated.fingerprint
    out = through_proxy(estubs, s.session_id, connect("up.test", echo))
    assert "NAME_NOT_ALLOWED" in out
    assert through_proxy(estubs, s.session_id, connect("a.wild.test", echo, "b")).endswith("ECHO:b")
    expect_error(
        lambda: estubs.sessions.UpdateNetworkPolicy(
            session_pb2.UpdateNetworkPolicyRequest(
                session_id=s.session_id, network=common_pb2.NetworkPolicy()
            )
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "NETWORK_MODE_FIXED",
    )


@pytest.mark.parametrize(
    ("network", "reason"),
    [
        (allowlist([], [443], private=False), "NETWORK_POLICY_INVALID"),
        (allowlist(["example.com"], [], private=False), "NETWORK_POLICY_INVALID"),
        (allowlist(["10.0.0.1"], [443], private=False), "NETWORK_POLICY_INVALID"),
        (allowlist(["a.*.com"], [443], private=False), "NETWORK_POLICY_INVALID"),
        (allowlist(["example.com"], [70000], private=False), "NETWORK_POLICY_INVALID"),
        (allowlist(["example.com"], [443], False, max_connections=100000), "LIMIT_EXCEEDS_MAXIMUM"),
    ],
)
def test_invalid_policies(estubs: Stubs, network: common_pb2.NetworkPolicy, reason: str) -> None:
    expect_error(
        lambda: estubs.sessions.CreateSession(session_pb2.CreateSessionRequest(network=network)),
        grpc.StatusCode.INVALID_ARGUMENT,
        reason,
    )


def test_fingerprint_normalizes_domains_and_includes_quotas(estubs: Stubs, session_with) -> None:  # type: ignore[no-untyped-def]
    a = session_with(allowlist(["B.test", "a.test."], [443], private=False))
    b = session_with(allowlist(["a.test", "b.test"], [443], private=False))
    c = session_with(allowlist(["a.test", "b.test"], [443], private=False, max_requests=5))
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert c.network.quotas.max_requests == 5
    assert b.network.quotas.max_requests > 5  # the server default, filled in


def test_server_info_reports_filter(estubs: Stubs) -> None:
    info = estubs.admin.GetServerInfo(admin_pb2.GetServerInfoRequest())
    assert info.egress_filter == admin_pb2.EGRESS_FILTER_NO_NETWORK
    assert "egress" in info.features
    assert info.proxy_quotas_max.max_connections >= info.proxy_quotas_default.max_connections


def test_no_network_and_proxy_removed_with_session(estubs: Stubs, egress_server, upstreams) -> None:  # type: ignore[no-untyped-def]
    echo = upstreams["echo"]
    s = estubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            shell=common_pb2.ShellPolicy(allow_all=True),
            network=allowlist(["up.test"], [echo], private=True),
        )
    ).session
    assert_loopback_only(estubs, s.session_id)
    assert_no_owned_networks(egress_server.owner_id)
    out = through_proxy(estubs, s.session_id, connect("up.test", echo, "del"))
    assert out.endswith("ECHO:del"), out
    estubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=s.session_id))
    assert container_of(estubs, s.session_id) == ""
    assert_no_owned_networks(egress_server.owner_id)


def test_proxy_comes_back_after_restart(tmp_path: Path, upstreams) -> None:  # type: ignore[no-untyped-def]
    owner = "egr" + secrets.token_hex(4)
    env = server_env(upstreams)
    srv = start_server(tmp_path, owner, env=env)
    try:
        stubs = make_stubs(srv.address)
        s = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(
                shell=common_pb2.ShellPolicy(allow_all=True),
                network=allowlist(["up.test"], [upstreams["echo"]], private=True),
            )
        ).session
        assert through_proxy(
            stubs, s.session_id, connect("up.test", upstreams["echo"], "1")
        ).endswith("ECHO:1")
        stubs.channel.close()
        srv.stop()
        srv = start_server(tmp_path, owner, env=env)
        stubs = make_stubs(srv.address)
        assert wait_until(lambda: "egress proxy of" in srv.log(), 10)
        assert_no_owned_networks(owner)
        out = through_proxy(stubs, s.session_id, connect("up.test", upstreams["echo"], "2"))
        assert out.endswith("ECHO:2"), out + srv.log()
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=s.session_id))
        stubs.channel.close()
    finally:
        srv.stop()
        remove_owned_containers(owner)
        assert_no_owned_networks(owner)


def test_without_iptables_egress_works_and_without_the_agent_it_is_refused(
    tmp_path: Path, upstreams
) -> None:  # type: ignore[no-untyped-def]
    # A PATH with no iptables: nothing on the host needs a filter any more.
    env = {**server_env(upstreams), "PATH": "/nonexistent"}
    owner = "egr" + secrets.token_hex(4)
    srv = start_server(tmp_path / "a", owner, env=env)
    try:
        stubs = make_stubs(srv.address)
        info = stubs.admin.GetServerInfo(admin_pb2.GetServerInfoRequest())
        assert info.egress_filter == admin_pb2.EGRESS_FILTER_NO_NETWORK
        s = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(
                shell=common_pb2.ShellPolicy(allow_all=True),
                network=allowlist(["up.test"], [upstreams["echo"]], private=True),
            )
        ).session
        out = through_proxy(stubs, s.session_id, connect("up.test", upstreams["echo"], "np"))
        assert out.endswith("ECHO:np"), out
        stubs.channel.close()
    finally:
        srv.stop()
        remove_owned_containers(owner)
    # Without the agent (docker exec and an idle keeper) nothing could carry egress.
    srv = start_server(tmp_path / "b", owner, env={**env, "SANDBOXD_AGENT": "false"})
    try:
        stubs = make_stubs(srv.address)
        info = stubs.admin.GetServerInfo(admin_pb2.GetServerInfoRequest())
        assert info.egress_filter == admin_pb2.EGRESS_FILTER_UNAVAILABLE
        expect_error(
            lambda: stubs.sessions.CreateSession(
                session_pb2.CreateSessionRequest(network=allowlist(["up.test"], [80], False))
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "EGRESS_UNAVAILABLE",
        )
        stubs.channel.close()
    finally:
        srv.stop()
        remove_owned_containers(owner)
        assert_no_owned_networks(owner)


CLIENT = r"""
import ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile="/workspace/ca.pem")
opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))
for url in sys.argv[1:]:
    with opener.open(url, timeout=10) as resp:
        print(resp.status, resp.read().decode())
"""


@pytest.mark.skipif(
    subprocess.run(["docker", "image", "inspect", PYTHON_IMAGE], capture_output=True).returncode
    != 0,
    reason=f"{PYTHON_IMAGE} not built (make test builds it: scripts/build-python-image.sh)",
)
def test_real_http_and_tls_clients(estubs: Stubs, session_with, upstreams) -> None:  # type: ignore[no-untyped-def]
    https, http_port = upstreams["https"], upstreams["http"]
    s = session_with(
        allowlist(["tls.test", "up.test"], [https, http_port], private=True), image=PYTHON_IMAGE
    )
    from sandboxd.v1 import filesystem_pb2

    for path, content in (("ca.pem", upstreams["ca"]), ("client.py", CLIENT.encode())):
        estubs.files.WriteFile(
            filesystem_pb2.WriteFileRequest(session_id=s.session_id, path=path, content=content)
        )
    r = run(
        estubs,
        s.session_id,
        "python3",
        "client.py",
        f"https://tls.test:{https}/secure",
        f"http://up.test:{http_port}/plain",
        timeout=_secs(30),
    )
    assert r.exit_code == 0, r.stderr.decode()
    lines = r.stdout.decode().splitlines()
    assert lines[0] == f"200 hello from /secure host=tls.test:{https}"
    assert lines[1] == f"200 hello from /plain host=up.test:{http_port}"
    # TLS to a name that is not allowed fails at CONNECT, before any handshake
    r = run(estubs, s.session_id, "python3", "client.py", f"https://other.test:{https}/")
    assert r.exit_code != 0 and "403" in r.stderr.decode()
    assert os.environ.get("NEVER_SET_BY_TESTS") is None


def test_update_network_policy_with_a_field_mask(estubs: Stubs, session_with, upstreams) -> None:  # type: ignore[no-untyped-def]
    """AIP-134: only the masked fields change; the others keep their values."""
    from google.protobuf import field_mask_pb2

    echo = upstreams["echo"]
    s = session_with(allowlist(["up.test"], [echo], private=True))
    updated = estubs.sessions.UpdateNetworkPolicy(
        session_pb2.UpdateNetworkPolicyRequest(
            session_id=s.session_id,
            network=common_pb2.NetworkPolicy(allowed_domains=["other.test"]),
            update_mask=field_mask_pb2.FieldMask(paths=["allowed_domains"]),
        )
    ).session
    assert list(updated.network.allowed_domains) == ["other.test"]
    assert list(updated.network.allowed_ports) == [echo]  # not in the mask: kept
    assert updated.network.mode == ALLOWLIST and updated.network.allow_private_networks
    expect_error(
        lambda: estubs.sessions.UpdateNetworkPolicy(
            session_pb2.UpdateNetworkPolicyRequest(
                session_id=s.session_id,
                network=common_pb2.NetworkPolicy(),
                update_mask=field_mask_pb2.FieldMask(paths=["no_such_field"]),
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "NETWORK_POLICY_INVALID",
    )
