"""The Docker engine stops and starts again: calls fail fast with UNAVAILABLE ENGINE_UNAVAILABLE,
health says NOT_SERVING, and the server recovers on its own when the engine is back.

The shared engine is never touched: the test runs a private dockerd of its own (own socket,
data root, exec root and containerd; no bridge, no iptables) and points a server at it. The
private daemon lives in a network namespace of its own (`unshare --net`): a dockerd started with
`--bridge none` in the host's namespace deletes the host's `docker0`, and every container on the
default bridge then fails until the host's dockerd restarts. The server reaches it through a unix
socket in a temp dir, which works across network namespaces. tests/hostenv.py checks, for the
whole suite, that the host's interfaces, iptables rules and /etc/docker end as they began.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from conftest import (
    IMAGE,
    ServerProcess,
    Stubs,
    error_info,
    expect_error,
    make_stubs,
    run,
    start_server,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sandboxd.v1 import admin_pb2, common_pb2, process_pb2, session_pb2

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(
        os.geteuid() != 0
        or any(shutil.which(tool) is None for tool in ("dockerd", "unshare", "ip")),
        reason="needs root, dockerd, unshare and ip to run a private Docker engine",
    ),
]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class PrivateEngine:
    """A dockerd that only this test uses; stopped and started at will."""

    root: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.root / 'docker.sock'}"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def start(self) -> None:
        (self.root / "daemon.json").write_text("{}\n")  # not the host's /etc/docker/daemon.json
        log = (self.root / "dockerd.log").open("ab")
        self.proc = subprocess.Popen(
            [
                # A network namespace of its own, loopback up; `exec` keeps the pid dockerd's.
                "unshare",
                "--net",
                "--",
                "sh",
                "-c",
                'ip link set lo up && exec "$@"',
                "sh",
                "dockerd",
                "--host",
                self.host,
                "--data-root",
                str(self.root / "data"),
                "--exec-root",
                str(self.root / "exec"),
                "--pidfile",
                str(self.root / "docker.pid"),
                "--config-file",
                str(self.root / "daemon.json"),
                # no docker0, no firewall or forwarding changes: nothing the shared engine owns
                "--bridge",
                "none",
                "--iptables=false",
                "--ip-masq=false",
                "--ip-forward=false",
                "--userland-proxy=false",
                "--shutdown-timeout",
                "2",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"private dockerd exited:\n{self.log()}")
            if self.docker("version", check=False).returncode == 0:
                return
            time.sleep(0.25)
        raise RuntimeError(f"private dockerd did not answer:\n{self.log()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def docker(
        self, *args: str, check: bool = True, **kw: object
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(  # type: ignore[call-overload, no-any-return]
            ["docker", *args], capture_output=True, env=self.env, timeout=60, check=check, **kw
        )

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "dockerd.log").read_text(errors="replace")[-3000:]
        return ""

    def cleanup(self) -> None:
        """Remove every container, stop the daemon, unmount what it left, delete its files."""
        if self.proc is not None and self.proc.poll() is None:
            ids = self.docker("ps", "-aq", check=False).stdout.split()
            if ids:
                self.docker("rm", "-f", *[i.decode() for i in ids], check=False)
        self.stop()
        with open("/proc/self/mounts") as fh:
            mounts = [line.split()[1] for line in fh]
        for target in sorted((m for m in mounts if m.startswith(str(self.root))), reverse=True):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def engine() -> Iterator[PrivateEngine]:
    # Short path: containerd's sockets live under the exec root (sun_path is 108 bytes).
    private = PrivateEngine(Path(tempfile.mkdtemp(prefix="sbxeng-")))
    try:
        private.start()
        saved = subprocess.Popen(["docker", "save", IMAGE], stdout=subprocess.PIPE)
        assert saved.stdout is not None
        with saved.stdout:
            private.docker("load", stdin=saved.stdout)
        assert saved.wait(60) == 0
        yield private
    finally:
        private.cleanup()


def health_status(stubs: Stubs, service: str = "") -> int:
    health = health_pb2_grpc.HealthStub(stubs.channel)
    return health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status  # type: ignore[no-any-return]


def wait_for_health(stubs: Stubs, status: int, timeout: float) -> float:
    """Seconds until health reports `status` for the server and each service."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if all(
            health_status(stubs, s) == status
            for s in ("", "sandboxd.v1.SessionService", "sandboxd.v1.ProcessService")
        ):
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"health never became {status} in {timeout} s")


def timed_error(call: object, code: grpc.StatusCode, reason: str) -> float:
    start = time.monotonic()
    expect_error(call, code, reason)  # type: ignore[arg-type]
    return time.monotonic() - start


def test_engine_stops_and_starts_again(engine: PrivateEngine, tmp_path: Path) -> None:
    owner = "outage" + secrets.token_hex(3)
    server: ServerProcess = start_server(tmp_path, owner, "--docker-host", engine.host)
    stubs = make_stubs(server.address)
    try:
        assert health_status(stubs) == SERVING, server.log()
        shell = common_pb2.ShellPolicy(allow=["sh", "echo", "cat", "sleep"])
        old = stubs.sessions.CreateSession(session_pb2.CreateSessionRequest(shell=shell)).session
        assert run(stubs, old.session_id, "echo", "before").stdout == b"before\n"
        # A session with no command in flight when the engine goes.
        idle = stubs.sessions.CreateSession(session_pb2.CreateSessionRequest(shell=shell)).session

        # A command in flight when the engine goes: its call must end, not hang.
        ended: list[object] = []

        def follow() -> None:
            try:
                for event in stubs.processes.Exec(
                    process_pb2.ExecRequest(session_id=old.session_id, argv=["sleep", "60"]),
                    timeout=60,
                ):
                    ended.append(event.WhichOneof("event"))
            except grpc.RpcError as exc:
                ended.append(exc)

        follower = threading.Thread(target=follow)
        follower.start()
        time.sleep(0.5)

        engine.stop()
        follower.join(30)
        assert not follower.is_alive(), "a call in flight hung when the engine stopped"
        last = ended[-1]
        if isinstance(last, grpc.RpcError):
            assert last.code() in (  # type: ignore[attr-defined]
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.FAILED_PRECONDITION,
            ), f"{last.code()} {last.details()}"  # type: ignore[attr-defined]
        else:
            assert last == "exited"

        assert wait_for_health(stubs, NOT_SERVING, timeout=5) < 5
        took = timed_error(
            lambda: stubs.sessions.CreateSession(session_pb2.CreateSessionRequest(shell=shell)),
            grpc.StatusCode.UNAVAILABLE,
            "ENGINE_UNAVAILABLE",
        )
        assert took < 6, f"CreateSession took {took:.1f} s to fail during the outage"
        # Every session's agent channel is a live attach to its container, so each one may
        # have seen its container stopped by the engine on its way down (the engine still
        # answered: not running): lost at once, truthfully (the workspace tmpfs is gone with
        # it); or the engine unavailable if the engine was gone before the check. Either way
        # the call ends at once.
        for session in (idle, old):
            start = time.monotonic()
            with pytest.raises(grpc.RpcError) as during:
                run(stubs, session.session_id, "echo", "during")
            took = time.monotonic() - start
            assert (during.value.code(), error_info(during.value).reason) in (  # type: ignore[attr-defined]
                (grpc.StatusCode.UNAVAILABLE, "ENGINE_UNAVAILABLE"),
                (grpc.StatusCode.FAILED_PRECONDITION, "CONTAINER_LOST"),
            ), during.value
            assert took < 6, f"Run took {took:.1f} s to fail during the outage"
        expect_error(
            lambda: stubs.admin.GetServerInfo(admin_pb2.GetServerInfoRequest()),
            grpc.StatusCode.UNAVAILABLE,
            "ENGINE_UNAVAILABLE",
        )
        # the session store does not need the engine
        got = stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=old.session_id))
        assert got.session.session_id == old.session_id

        engine.start()
        assert wait_for_health(stubs, SERVING, timeout=10) < 10, server.log()
        new = stubs.sessions.CreateSession(session_pb2.CreateSessionRequest(shell=shell)).session
        assert run(stubs, new.session_id, "echo", "after").stdout == b"after\n"

        # The old containers did not survive the engine restart: a clear, lasting error.
        for gone in (old, idle):
            for _ in range(2):
                expect_error(
                    lambda: run(stubs, gone.session_id, "echo", "lost"),  # noqa: B023
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "CONTAINER_LOST",
                )
            got = stubs.sessions.GetSession(
                session_pb2.GetSessionRequest(session_id=gone.session_id)
            )
            assert got.session.state == session_pb2.SESSION_STATE_FAILED
            stubs.sessions.DeleteSession(
                session_pb2.DeleteSessionRequest(session_id=gone.session_id)
            )
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=new.session_id))
        assert engine.docker("ps", "-aq").stdout.split() == []
    finally:
        stubs.channel.close()
        assert server.stop() == 0, server.log()
