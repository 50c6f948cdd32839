"""A remote Docker engine over TCP with mutual TLS.

The test runs a second dockerd of its own in a network namespace of its own (`ip netns add`),
reached only through a veth pair between this host and that namespace, addressed from a private
/30 nothing else on the host uses. The daemon listens on tcp:// with `--tlsverify` (a CA, server
and client certificates generated here); its data root and exec root live in a temp dir, and it
runs with no bridge, no iptables and no masquerading: the host's docker0, iptables rules and
/etc/docker are never touched (tests/hostenv.py checks them for the whole suite). Everything it
made (the daemon, its files, the veth pair, the namespace) is removed even when the test fails.

A real sandboxd server is pointed at it (`docker_host = tcp://...`, `docker_tls_*`) and runs the
core scenario there; a second server with a client certificate from another CA reports the
engine unavailable, clearly.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from authutil import Pki
from conftest import (
    IMAGE,
    ServerProcess,
    Stubs,
    expect_error,
    make_stubs,
    run,
    start_server,
    wait_until,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc
from mountcheck import bind_mounts
from sandboxd.config import Config
from sandboxd.v1 import (
    common_pb2,
    filesystem_pb2,
    process_pb2,
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
    template_pb2,
    template_pb2_grpc,
)

pytestmark = [
    pytest.mark.engine,
    pytest.mark.timeout(180),  # the scenario takes seconds; a stalled stream fails, not hangs
    pytest.mark.skipif(
        os.geteuid() != 0
        or any(shutil.which(tool) is None for tool in ("dockerd", "docker", "ip", "nsenter")),
        reason="needs root, dockerd, docker, ip and nsenter to run a remote Docker engine in a "
        "network namespace of its own",
    ),
]

PORT = 2376
ALL = common_pb2.ShellPolicy(allow_all=True)


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=check)


def free_slash30() -> ipaddress.IPv4Network:
    """A /30 in 10.254.0.0/16 that overlaps no address or route of this host."""
    used = []
    for line in (
        _sh("ip", "-o", "-4", "addr").stdout.splitlines()
        + _sh("ip", "-4", "route").stdout.splitlines()
    ):
        for word in line.split():
            with contextlib.suppress(ValueError):
                if "/" in word or word[0].isdigit():
                    used.append(ipaddress.ip_network(word, strict=False))
    pool = list(ipaddress.ip_network("10.254.0.0/16").subnets(new_prefix=30))
    random.shuffle(pool)
    for net in pool:
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free /30 in 10.254.0.0/16")


@dataclass
class RemoteEngine:
    """dockerd in its own network namespace, on tcp:// with TLS, reached over a veth pair."""

    root: Path
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    net: ipaddress.IPv4Network = field(default_factory=free_slash30)
    proc: subprocess.Popen[bytes] | None = None
    pki: Pki | None = None
    server_cert: tuple[Path, Path] = (Path(), Path())
    client: tuple[Path, Path] = (Path(), Path())
    made: list[str] = field(default_factory=list)  # what exists, for the clean-up

    @property
    def netns(self) -> str:
        return f"sbxrem-{self.tag}"

    @property
    def host_if(self) -> str:
        return f"sbxrh{self.tag}"  # at most 15 characters

    @property
    def host_ip(self) -> str:
        return str(self.net[1])

    @property
    def engine_ip(self) -> str:
        return str(self.net[2])

    @property
    def docker_host(self) -> str:
        return f"tcp://{self.engine_ip}:{PORT}"

    def client_files(self) -> tuple[Path, Path, Path]:
        assert self.pki is not None
        cert, key = self.client
        return self.pki.ca_path, cert, key

    def server_flags(self, ca: Path, cert: Path, key: Path) -> tuple[str, ...]:
        return (
            "--docker-host",
            self.docker_host,
            "--docker-tls-ca",
            str(ca),
            "--docker-tls-cert",
            str(cert),
            "--docker-tls-key",
            str(key),
        )

    @property
    def cli(self) -> list[str]:
        ca, cert, key = self.client_files()
        return ["docker", "--tlsverify", f"--tlscacert={ca}", f"--tlscert={cert}"] + [
            f"--tlskey={key}",
            "-H",
            self.docker_host,
        ]

    def docker(
        self, *args: str, check: bool = True, **kw: object
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(  # type: ignore[call-overload, no-any-return]
            [*self.cli, *args], capture_output=True, timeout=120, check=check, **kw
        )

    # ----- set-up ---------------------------------------------------------------------------

    def link(self) -> None:
        """The namespace and a veth pair: one end here, the other inside, each with its address."""
        _sh("ip", "netns", "add", self.netns)
        self.made.append("netns")
        peer = f"sbxrn{self.tag}"
        _sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", peer)
        self.made.append("veth")
        _sh("ip", "link", "set", peer, "netns", self.netns)
        _sh("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _sh("ip", "link", "set", self.host_if, "up")
        inside = ("ip", "netns", "exec", self.netns, "ip")
        _sh(*inside, "addr", "add", f"{self.engine_ip}/30", "dev", peer)
        _sh(*inside, "link", "set", peer, "up")
        _sh(*inside, "link", "set", "lo", "up")

    def certificates(self) -> None:
        (self.root / "pki").mkdir()
        self.pki = Pki(self.root / "pki", "engine")
        self.server_cert = self.pki.server_for(self.engine_ip)
        self.client = self.pki.client_files("sandboxd")

    def start(self) -> None:
        (self.root / "daemon.json").write_text("{}\n")  # not the host's /etc/docker/daemon.json
        cert, key = self.server_cert
        assert self.pki is not None
        log = (self.root / "dockerd.log").open("ab")
        self.proc = subprocess.Popen(
            # The namespace's network only: the mounts stay the host's (cleaned up below).
            ["nsenter", f"--net=/run/netns/{self.netns}", "--", "dockerd"]
            + ["--host", self.docker_host, "--tlsverify", f"--tlscacert={self.pki.ca_path}"]
            + [f"--tlscert={cert}", f"--tlskey={key}"]
            + ["--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec")]
            + ["--pidfile", str(self.root / "docker.pid")]
            + ["--config-file", str(self.root / "daemon.json")]
            # no docker0, no firewall or forwarding changes: nothing the host's engine owns
            + ["--bridge", "none", "--iptables=false", "--ip-masq=false", "--ip-forward=false"]
            + ["--userland-proxy=false", "--shutdown-timeout", "2"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"remote dockerd exited:\n{self.log()}")
            if self.docker("version", check=False).returncode == 0:
                return
            time.sleep(0.25)
        raise RuntimeError(f"remote dockerd did not answer:\n{self.log()}")

    def load(self, image: str) -> None:
        """The runtime image into the remote engine (`docker save | docker load` over TLS)."""
        saved = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        assert saved.stdout is not None
        with saved.stdout:
            self.docker("load", stdin=saved.stdout)
        assert saved.wait(60) == 0

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "dockerd.log").read_text(errors="replace")[-3000:]
        return ""

    # ----- clean-up -------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        """Everything this engine made, removed; returns what could not be (for the report)."""
        problems: list[str] = []
        if self.proc is not None and self.proc.poll() is None:
            ids = self.docker("ps", "-aq", check=False).stdout.split()
            if ids:
                self.docker("rm", "-f", *[i.decode() for i in ids], check=False)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with open("/proc/self/mounts") as fh:
            mounts = [line.split()[1] for line in fh]
        for target in sorted((m for m in mounts if m.startswith(str(self.root))), reverse=True):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
        if "veth" in self.made:  # deleting one end deletes the pair
            if _sh("ip", "link", "del", self.host_if, check=False).returncode != 0:
                problems.append(f"veth {self.host_if} not removed")
        if "netns" in self.made:
            if _sh("ip", "netns", "del", self.netns, check=False).returncode != 0:
                problems.append(f"netns {self.netns} not removed")
        shutil.rmtree(self.root, ignore_errors=True)
        return problems


DISK_TOOL_IMAGE = Config().engine.disk_tool_image


@pytest.fixture(scope="module")
def engine() -> Iterator[RemoteEngine]:
    # Short path: containerd's sockets live under the exec root (sun_path is 108 bytes).
    remote = RemoteEngine(Path(tempfile.mkdtemp(prefix="sbxrem-")))
    try:
        remote.link()
        remote.certificates()
        remote.start()
        remote.load(IMAGE)
        remote.load(DISK_TOOL_IMAGE)  # disk workspaces: made by the server through the API
        yield remote
    finally:
        problems = remote.cleanup()
    assert not problems, problems
    assert remote.netns not in _sh("ip", "netns", "list").stdout
    assert remote.host_if not in _sh("ip", "-o", "link").stdout


@pytest.fixture(scope="module")
def server(
    engine: RemoteEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    srv = start_server(
        tmp_path_factory.mktemp("remote"),
        "remote" + secrets.token_hex(3),
        *engine.server_flags(*engine.client_files()),
    )
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def stubs(server: ServerProcess) -> Iterator[Stubs]:
    s = make_stubs(server.address)
    yield s
    s.channel.close()


def health(stubs: Stubs) -> int:
    check = health_pb2_grpc.HealthStub(stubs.channel).Check
    return check(health_pb2.HealthCheckRequest(), timeout=5).status  # type: ignore[no-any-return]


def owned(engine: RemoteEngine, owner: str) -> list[str]:
    out = engine.docker("ps", "-aq", "--no-trunc", "--filter", f"label=io.sandboxd.owner={owner}")
    return out.stdout.decode().split()


def tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# ----- the core scenario -----------------------------------------------------------------------


def test_core_scenario_on_a_remote_engine(
    engine: RemoteEngine, server: ServerProcess, stubs: Stubs
) -> None:
    assert health(stubs) == health_pb2.HealthCheckResponse.SERVING, server.log()
    created = stubs.sessions.CreateSession(session_pb2.CreateSessionRequest(shell=ALL)).session
    sid = created.session_id
    # The session's container is on the remote engine, and only there.
    on_remote = owned(engine, server.owner_id)
    assert len(on_remote) == 1, on_remote
    local = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=io.sandboxd.owner={server.owner_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert local == []
    # The helper reached the remote engine through its API: a volume, not a path of this host.
    mounts = engine.docker("inspect", "--format", "{{json .Mounts}}", on_remote[0]).stdout
    assert b'"Type":"volume"' in mounts and b"sandboxd-helper-" in mounts, mounts
    assert b'"Type":"bind"' not in mounts, mounts

    # Run
    r = run(stubs, sid, "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code) == (b"out\n", b"err\n", 3)

    # Exec: output streamed as it is written, then the exit.
    script = "for i in 1 2 3; do echo line$i; sleep 0.3; done"
    arrivals: list[tuple[float, bytes]] = []
    exited = None
    for event in stubs.processes.Exec(
        process_pb2.ExecRequest(session_id=sid, argv=["sh", "-c", script]), timeout=60
    ):
        kind = event.WhichOneof("event")
        if kind == "output" and event.output.stream == process_pb2.OUTPUT_STREAM_STDOUT:
            arrivals.append((time.monotonic(), event.output.data))
        elif kind == "exited":
            exited = event.exited
    assert b"".join(d for _, d in arrivals) == b"line1\nline2\nline3\n"
    assert len(arrivals) >= 2 and arrivals[-1][0] - arrivals[0][0] > 0.4, "not streamed"
    assert exited is not None and exited.exit_code == 0

    # Stdin to a background process, then EOF (a half-close under TLS).
    started = stubs.processes.StartProcess(
        process_pb2.StartProcessRequest(
            session_id=sid, argv=["cat"], stdin=b"first\n", keep_stdin_open=True
        ),
        timeout=60,
    ).process
    stubs.processes.SendProcessInput(
        process_pb2.SendProcessInputRequest(
            session_id=sid, process_id=started.process_id, data=b"more\n"
        )
    )
    stubs.processes.CloseProcessStdin(
        process_pb2.CloseProcessStdinRequest(session_id=sid, process_id=started.process_id)
    )

    def ended() -> bool:
        got = stubs.processes.GetProcess(
            process_pb2.GetProcessRequest(session_id=sid, process_id=started.process_id)
        ).process
        return got.state == process_pb2.PROCESS_STATE_EXITED

    assert wait_until(ended, timeout=20), "cat never saw the end of its stdin"
    replay = stubs.processes.AttachProcess(
        process_pb2.AttachProcessRequest(session_id=sid, process_id=started.process_id),
        timeout=30,
    )
    assert b"".join(
        e.output.data
        for e in replay
        if e.HasField("output") and e.output.stream == process_pb2.OUTPUT_STREAM_STDOUT
    ) == (b"first\nmore\n")

    # Files: write, read, list.
    files = stubs.files
    files.WriteFile(
        filesystem_pb2.WriteFileRequest(
            session_id=sid, path="notes/a.txt", content=b"alpha\n", make_parents=True
        )
    )
    read = files.ReadFile(filesystem_pb2.ReadFileRequest(session_id=sid, path="notes/a.txt"))
    assert read.content == b"alpha\n"
    listed = files.ListDir(filesystem_pb2.ListDirRequest(session_id=sid, path="notes"))
    assert [e.name for e in listed.entries] == ["a.txt"]

    # Archives: import a tar (stdin to the helper, ended by a TLS half-close), export it back.
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)
    payload = tar_of({"imported/b.txt": b"bravo\n", "imported/c.txt": os.urandom(300_000)})

    def upload() -> Iterator[snapshot_pb2.ImportArchiveRequest]:
        yield snapshot_pb2.ImportArchiveRequest(
            header=snapshot_pb2.ImportArchiveHeader(session_id=sid)
        )
        for i in range(0, len(payload), 64 * 1024):
            yield snapshot_pb2.ImportArchiveRequest(data=payload[i : i + 64 * 1024])

    snaps.ImportArchive(upload(), timeout=60)
    assert run(stubs, sid, "cat", "imported/b.txt").stdout == b"bravo\n"
    exported = b"".join(
        r.chunk.data
        for r in snaps.ExportArchive(
            snapshot_pb2.ExportArchiveRequest(session_id=sid, path="imported"), timeout=60
        )
    )
    with tarfile.open(fileobj=io.BytesIO(exported)) as tar:
        names = {m.name.lstrip("./") for m in tar.getmembers() if m.isfile()}
    assert {"b.txt", "c.txt"} <= {n.rpartition("/")[2] for n in names}, names

    # Suspend and resume: the workspace comes back in a new container on the remote engine.
    stubs.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=sid))
    assert owned(engine, server.owner_id) == []
    stubs.sessions.ResumeSession(session_pb2.ResumeSessionRequest(session_id=sid))
    assert run(stubs, sid, "cat", "notes/a.txt").stdout == b"alpha\n"

    # Snapshot (an image committed on the remote engine) and a fork from it.
    snap = snaps.CreateSnapshot(
        snapshot_pb2.CreateSnapshotRequest(session_id=sid, kind=snapshot_pb2.SNAPSHOT_KIND_IMAGE)
    ).snapshot
    assert snap.image.startswith("sha256:")
    assert engine.docker("image", "inspect", snap.image, check=False).returncode == 0
    fork = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(from_snapshot_id=snap.snapshot_id, shell=ALL)
    ).session
    assert run(stubs, fork.session_id, "cat", "imported/b.txt").stdout == b"bravo\n"

    # A template built on the remote engine (its context streamed there), and a session of it.
    templates = template_pb2_grpc.TemplateServiceStub(stubs.channel)
    name = "remote-" + secrets.token_hex(3)
    dockerfile = "FROM busybox\nCOPY greeting.txt /opt/greeting.txt\nRUN cat /opt/greeting.txt\n"
    context = tar_of({"greeting.txt": b"hello from afar\n"})

    def build() -> Iterator[template_pb2.BuildTemplateRequest]:
        yield template_pb2.BuildTemplateRequest(
            spec=template_pb2.TemplateSpec(name=name, dockerfile=dockerfile)
        )
        yield template_pb2.BuildTemplateRequest(context=context)

    done = [
        r.done.template for r in templates.BuildTemplate(build(), timeout=120) if r.HasField("done")
    ]
    assert done and done[0].state == template_pb2.TEMPLATE_STATE_READY, done
    built = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(template=name, shell=ALL)
    ).session
    assert run(stubs, built.session_id, "cat", "/opt/greeting.txt").stdout == b"hello from afar\n"

    # No container on the remote engine has a bind mount from the server's file system.
    containers = owned(engine, server.owner_id)
    assert len(containers) == 3, containers
    assert bind_mounts(containers, engine.cli) == {}

    # Delete: nothing of the server's is left on the remote engine.
    for s in (sid, fork.session_id, built.session_id):
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=s))
    snaps.DeleteSnapshot(snapshot_pb2.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id))
    templates.DeleteTemplate(template_pb2.DeleteTemplateRequest(name=name))
    assert owned(engine, server.owner_id) == []


def test_a_disk_workspace_on_a_remote_engine(engine: RemoteEngine, stubs: Stubs) -> None:
    """A disk is made, mounted, kept by a suspend and removed all through the remote engine's
    API: its volumes are on that engine, nothing is made on this host's."""
    workspace = session_pb2.WorkspaceManifest(
        storage=session_pb2.WORKSPACE_STORAGE_DISK, size_bytes=256 * 1024 * 1024
    )
    req = session_pb2.CreateSessionRequest(shell=ALL, workspace=workspace)
    sid = stubs.sessions.CreateSession(req).session.session_id
    try:
        r = run(stubs, sid, "sh", "-c", "echo kept > /workspace/k; df -k /workspace | tail -n 1")
        assert r.exit_code == 0 and int(r.stdout.split()[1]) > 200 * 1024, r
        volumes = engine.docker("volume", "ls", "-q", "--filter", "label=io.sandboxd.disk")
        assert len(volumes.stdout.split()) == 2, volumes.stdout  # its image and its mount
        local = subprocess.run(
            ["docker", "volume", "ls", "-q", "--filter", "label=io.sandboxd.disk"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert not [v for v in local if v in volumes.stdout.decode().split()]
        stubs.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=sid))
        assert run(stubs, sid, "cat", "/workspace/k").stdout == b"kept\n"  # resumed on its disk
    finally:
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
    left = engine.docker("volume", "ls", "-q", "--filter", "label=io.sandboxd.disk")
    assert left.stdout.split() == []


def test_allowlist_egress_reaches_this_servers_proxy_from_a_remote_engine(stubs: Stubs) -> None:
    """Egress rides the agent's channel, so a remote engine needs nothing of this host: the
    sandbox has only loopback, and its CONNECT reaches this server's proxy, which decides
    (a name outside the allowlist is refused by the proxy itself; nothing is dialled)."""
    policy = common_pb2.NetworkPolicy(
        mode=common_pb2.NETWORK_MODE_ALLOWLIST, allowed_domains=["example.com"], allowed_ports=[443]
    )
    sid = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=ALL, network=policy)
    ).session.session_id
    try:
        links = run(stubs, sid, "ls", "/sys/class/net").stdout.split()
        assert links == [b"lo"], links
        ask = "CONNECT other.invalid:443 HTTP/1.1\\r\\nHost: other.invalid:443\\r\\n\\r\\n"
        nc = 'P=${HTTP_PROXY#http://}; printf "%b" "$PAYLOAD" | nc -w 5 "${P%:*}" "${P#*:}"'
        out = run(stubs, sid, "sh", "-c", nc, env={"PAYLOAD": ask}).stdout.decode(errors="replace")
        assert "X-Sandboxd-Egress-Reason: NAME_NOT_ALLOWED" in out, out
    finally:
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


@pytest.mark.parametrize("wrong", ["client certificate", "engine CA"])
def test_a_tls_mismatch_reports_the_engine_unavailable(
    engine: RemoteEngine, tmp_path: Path, wrong: str
) -> None:
    """A client certificate from a CA the engine does not trust, or a docker_tls_ca that did not
    sign the engine's certificate: the server starts (the engine may be fixed later), says
    NOT_SERVING, and every call needing the engine fails fast with UNAVAILABLE
    ENGINE_UNAVAILABLE naming the TLS failure and the settings to check."""
    (tmp_path / "other").mkdir()
    other = Pki(tmp_path / "other", "other")
    ca, cert, key = engine.client_files()
    if wrong == "client certificate":
        cert, key = other.client_files("intruder")
    else:
        ca = other.ca_path
    srv = start_server(
        tmp_path / "data", "wrongtls" + secrets.token_hex(3), *engine.server_flags(ca, cert, key)
    )
    stubs = make_stubs(srv.address)
    try:
        assert wait_until(
            lambda: health(stubs) == health_pb2.HealthCheckResponse.NOT_SERVING, timeout=10
        ), srv.log()
        start = time.monotonic()
        err = expect_error(
            lambda: stubs.sessions.CreateSession(session_pb2.CreateSessionRequest(shell=ALL)),
            grpc.StatusCode.UNAVAILABLE,
            "ENGINE_UNAVAILABLE",
        )
        assert time.monotonic() - start < 10
        details = err.details()  # type: ignore[attr-defined]
        assert "TLS connection to the Docker engine failed" in details, details
        assert "docker_tls_cert" in details, details
        assert re.search(r"engine unavailable: .*TLS connection", srv.log()), srv.log()
    finally:
        stubs.channel.close()
        assert srv.stop() == 0, srv.log()
