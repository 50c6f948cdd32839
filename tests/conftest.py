"""Shared fixtures: a real sandboxd server process on a free port, over the real Docker engine."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from containers import SOCKET_CHANNEL
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from sandboxd.v1 import (
    admin_pb2_grpc,
    common_pb2,
    filesystem_pb2_grpc,
    process_pb2,
    process_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)

# Fixtures of the hostile-input suite (bystander, victim, guard), kept in their own module;
# mountcheck: no container of a test's server has a bind mount (checked in every engine test);
# agent_pipes: the helper's builds, made once per session, for the real agent over pipes.
pytest_plugins = ["hostile", "mountcheck", "agent_pipes"]


@pytest.fixture(scope="session", autouse=True)
def host_untouched(request: pytest.FixtureRequest) -> Iterator[None]:
    """The suite leaves the host's interfaces, iptables rules, /etc/docker and the engine's
    images as it found them.

    tests/hostenv.py says what is compared and what is left out (per-network state of networks
    that exist, counters, the Makefile's images, other runs' servers' images). A change fails
    the last test's teardown with a diff. A run of the Docker-free layer alone asks nothing of
    the engine (`make test-unit` must pass where none is reachable), so the check is made only
    when an engine test was collected.
    """
    if not any(item.get_closest_marker("engine") for item in request.session.items):
        yield
        return
    import hostenv
    import mountcheck

    workeroutput = getattr(request.config, "workeroutput", None)
    if workeroutput is not None:
        # An xdist worker: the others still run when it ends, so the controller compares the
        # host once after all of them (_HostCheckAfterWorkers), with the servers each started.
        yield
        workeroutput[_OWNERS_KEY] = sorted(mountcheck.OWNERS)
        return
    before = hostenv.settled_snapshot()
    yield
    diff = hostenv.changes_since(before, frozenset(mountcheck.OWNERS))
    if diff:
        pytest.fail("the suite changed the host:\n" + diff, pytrace=False)


_OWNERS_KEY = "sandboxd_server_owners"


class _HostCheckAfterWorkers:
    """`host_untouched` for a run on xdist workers (`make test`'s parallel pass), made by the
    controller: the snapshot before any worker runs a test (when the first worker has collected,
    and only if it collected an engine test), the comparison after the last worker has ended,
    with the owner ids of every worker's servers. A change fails the run (exit status 1) with
    the same diff; a worker's own end would see the others' sessions and images as leftovers."""

    def __init__(self) -> None:
        self.before: object = None
        self.owners: set[str] = set()

    @pytest.hookimpl(optionalhook=True)  # xdist's hooks: called only in a run on workers
    def pytest_xdist_node_collection_finished(self, node: object, ids: list[str]) -> None:
        if self.before is not None:
            return
        if any(Path(nodeid.partition("::")[0]).parent.name in _ENGINE_LAYERS for nodeid in ids):
            import hostenv

            self.before = hostenv.settled_snapshot()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: object, error: object) -> None:
        self.owners.update(getattr(node, "workeroutput", {}).get(_OWNERS_KEY, ()))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        import hostenv

        if not isinstance(self.before, hostenv.HostState):
            return
        diff = hostenv.changes_since(self.before, frozenset(self.owners))
        if diff:
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.ensure_newline()
                reporter.write_sep("=", "the suite changed the host", red=True)
                reporter.write_line(diff)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # not an xdist worker; idle unless it has workers
        config.pluginmanager.register(_HostCheckAfterWorkers(), "sandboxd-host-check")


# The layer a test belongs to is its folder: unit/ runs without Docker (`make test-unit`),
# integration/ and clients/ need the real engine and a real server, so they get the marker here
# rather than by hand in each file.
_ENGINE_LAYERS = ("integration", "clients")


# `make test` runs the engine layers in two passes: every test not marked `serial` on a few xdist
# workers at once (whole modules per worker, `--dist loadfile`: a module's tests keep their order
# and its module-scoped server), then the `serial` ones alone on the host. Serial are the modules
# below, whole, and single tests marked by hand whose assertions bound a wall-clock time tightly
# (a cancellation seen within a second), which a busier host could stretch. A module here:
# - starts its own dockerd (a private engine stopped and started, with its bridges and rules:
#   test_engine_outage, test_memory_suspend_engine, test_remote_engine, test_snapshots_engine,
#   test_volumes_engine_restart);
# - counts what the whole host has (loop devices: test_disk_loops; every container and image
#   labelled as a template build, whoever's: test_templates, test_hostile_templates);
# - needs a fixed host port free (127.0.0.1:9464, the metrics default: test_observability);
# - bounds a server's exit after SIGTERM by its grace period and margins (test_shutdown).
SERIAL_MODULES = frozenset(
    {
        "test_engine_outage",
        "test_memory_suspend_engine",
        "test_remote_engine",
        "test_snapshots_engine",
        "test_volumes_engine_restart",
        "test_disk_loops",
        "test_templates",
        "test_hostile_templates",
        "test_observability",
        "test_shutdown",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        layer = Path(str(item.path)).parent.name
        if layer in _ENGINE_LAYERS:
            item.add_marker(pytest.mark.engine)
            if Path(str(item.path)).stem in SERIAL_MODULES:
                item.add_marker(pytest.mark.serial)


REPO = Path(__file__).resolve().parents[1]
HELPER = REPO / "build" / "sbx"
IMAGE = os.environ.get("SANDBOXD_TEST_IMAGE", "sandboxd-runtime:busybox")
_LISTEN_RE = re.compile(r"listening on (\S+):(\d+)")
_CHANNEL_RE = re.compile(r"agent channel of ([0-9a-f]{12}): (socket|attach)")
_GVISOR_CHANNEL_RE = re.compile(
    r"agent channel of ([0-9a-f]{12}): attach \(its container \(runtime (?!runc\))"
)


@dataclass
class ServerProcess:
    """A sandboxd child process; its log is collected for failure messages."""

    proc: subprocess.Popen[str]
    data_dir: Path
    owner_id: str
    port: int = 0
    log_lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return "".join(self.log_lines[-200:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.reader is not None:
            self.reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def start_server(
    data_dir: Path, owner_id: str, *extra: str, env: dict[str, str] | None = None
) -> ServerProcess:
    args = [
        sys.executable,
        "-m",
        "sandboxd",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        str(data_dir),
        "--owner-id",
        owner_id,
        "--helper",
        str(HELPER),
        "--image",
        IMAGE,
        "--reaper-interval-s",
        "0.5",
        "--engine-check-interval-s",
        "0.5",
        *extra,
    ]
    import mountcheck  # loaded as a plugin above (imported here after, so it is rewritten)

    mountcheck.watch_owner(owner_id)
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Metrics are on by default at 127.0.0.1:9464; test servers run side by side, so each
        # takes a port of its own unless the test names one (its variable or flag wins).
        env={"SANDBOXD_METRICS_LISTEN": "127.0.0.1:0", **os.environ, **(env or {})},
    )
    server = ServerProcess(proc, data_dir, owner_id)
    found = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            server.log_lines.append(line)
            m = _LISTEN_RE.search(line)
            if m and not found.is_set():
                server.port = int(m.group(2))
                found.set()
        found.set()

    server.reader = threading.Thread(target=reader, daemon=True)
    server.reader.start()
    if not found.wait(30) or not server.port:
        server.stop(signal.SIGKILL)
        raise RuntimeError("sandboxd did not start:\n" + server.log())
    return server


def delete_volumes(srv: ServerProcess) -> None:
    """Every volume a test server holds, deleted through its API before it stops: volumes
    outlive their server by design, so a test that made one (the hostile-field walks call
    CreateVolume with whatever they send) would leave its disk on the engine."""
    from sandboxd.v1 import volumes_pb2, volumes_pb2_grpc

    with grpc.insecure_channel(srv.address) as channel:
        stub = volumes_pb2_grpc.VolumeServiceStub(channel)
        with contextlib.suppress(grpc.RpcError):
            token = ""
            while True:
                page = stub.ListVolumes(
                    volumes_pb2.ListVolumesRequest(page_size=100, page_token=token), timeout=30
                )
                for v in page.volumes:
                    with contextlib.suppress(grpc.RpcError):
                        stub.DeleteVolume(
                            volumes_pb2.DeleteVolumeRequest(volume_id=v.volume_id), timeout=60
                        )
                token = page.next_page_token
                if not token:
                    break


def remove_owned_disks(owner_id: str) -> None:
    """The disks a stopped test server left (a session or pool member not deleted, a failed
    test's), deleted as the server deletes them: detached from their loop device before their
    image volume goes. `docker volume rm` of an attached image would leave the loop on a
    deleted file, holding its blocks until the host restarts (tests/hostenv.py reports it).
    A disk that cannot be deleted stays, for the host check to name; other volumes of the
    owner (not disks) are removed."""
    import asyncio

    import aiodocker
    from sandboxd.engine.docker_errors import translate_errors
    from sandboxd.storage.disk_tool import DISK_MOUNT_PREFIX, LABEL_DISK
    from sandboxd.storage.docker_disks import DockerDisks

    async def remove() -> None:
        async with aiodocker.Docker() as docker:
            disks = DockerDisks(
                lambda: docker,
                translate_errors,
                owner_id=owner_id,
                tool_image="sandboxd-disktool:1",  # the server's default
            )
            for disk_id in await disks.list_ids():
                with contextlib.suppress(Exception):
                    await disks.delete(disk_id)
            found = await docker.volumes.list(  # type: ignore[no-untyped-call]
                filters={"label": [f"io.sandboxd.owner={owner_id}"]}
            )
            for v in found.get("Volumes") or []:
                name = str(v.get("Name", ""))
                disk = LABEL_DISK in (v.get("Labels") or {})
                if not disk or name.startswith(DISK_MOUNT_PREFIX):
                    with contextlib.suppress(aiodocker.DockerError):
                        await aiodocker.volumes.DockerVolume(docker, name).delete()  # type: ignore[no-untyped-call]

    asyncio.run(remove())


@contextlib.contextmanager
def own_server(
    data_dir: Path, owner_id: str, *extra: str, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    """A test module's own server (start_server's arguments), stopped and its containers,
    socket volumes and images removed when the block ends, however it ends."""
    srv = start_server(data_dir, owner_id, *extra, env=env)
    try:
        yield srv
    finally:
        srv.stop()
        remove_owned_containers(owner_id)


def remove_owned_containers(owner_id: str) -> None:
    """What a stopped test server leaves on the engine: its containers, then its images (IMAGE
    snapshots, labelled with its owner id; a snapshot a test did not delete, or could not
    because it failed first, would outlive the run: tests/hostenv.py reports such images)."""
    owned = f"label=io.sandboxd.owner={owner_id}"
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter", owned], capture_output=True, text=True, check=False
    ).stdout.split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, check=False)
    # Their agent socket volumes (engine/agent_socket.py), which the server removes with them.
    volumes = subprocess.run(
        [
            "docker",
            "volume",
            "ls",
            "-q",
            "--filter",
            owned,
            "--filter",
            "label=io.sandboxd.agent-socket",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if volumes:
        subprocess.run(["docker", "volume", "rm", "-f", *volumes], capture_output=True, check=False)
    images = subprocess.run(
        ["docker", "images", "-aq", "--no-trunc", "--filter", owned],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if images:
        # Forced: a snapshot image may carry a second tag (a test's own); its containers are gone.
        subprocess.run(["docker", "rmi", "-f", *set(images)], capture_output=True, check=False)


# Modules whose every test also runs on a server whose sessions default to gVisor (a
# representative subset: the whole suite twice would double CI time). A module joins by name here
# or by setting `TIERS = ("runc", "gvisor")` at its top level.
TIERED_MODULES = frozenset(
    {
        "test_sessions",
        "test_exec",
        "test_files",
        "test_archive",
        "test_hostile_exec",
        "test_hostile_paths",
        "test_isolation",
    }
)


def gvisor_registered() -> bool:
    """Whether the engine has the `runsc` runtime (`make gvisor` registers it)."""
    out = subprocess.run(
        ["docker", "info", "--format", "{{json .Runtimes}}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return '"runsc"' in out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "tier" not in metafunc.fixturenames:
        return
    module = metafunc.module
    tiers = getattr(module, "TIERS", None)
    if tiers is None and module.__name__.rpartition(".")[2] in TIERED_MODULES:
        tiers = ("runc", "gvisor")
    if tiers:
        metafunc.parametrize("tier", tiers, indirect=True, scope="module")


@pytest.fixture(scope="module")
def tier(request: pytest.FixtureRequest) -> str:
    """The isolation tier this module's sessions default to (runc unless parametrised)."""
    value = str(getattr(request, "param", "runc"))
    if value == "gvisor" and not gvisor_registered():
        pytest.skip("gVisor tier skipped: runsc is not registered with the engine (`make gvisor`)")
    return value


@pytest.fixture(scope="session")
def _servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    """One server per tier, started when a test first needs it and kept for the session."""
    started: dict[str, ServerProcess] = {}
    yield started
    for srv in started.values():
        delete_volumes(srv)
        srv.stop()
        remove_owned_containers(srv.owner_id)
    # A run with the socket channel (the default; SANDBOXD_AGENT_SOCKET=false turns it off)
    # must have had it: every runc channel over the socket, none fallen back to the attach.
    if SOCKET_CHANNEL:
        runc = started.get("runc")
        kinds = _CHANNEL_RE.findall("".join(runc.log_lines)) if runc is not None else []
        # (a gVisor sandbox of this server's has no socket: its channel is the attach)
        lines = runc.log_lines if runc is not None else []
        gvisor = set(_GVISOR_CHANNEL_RE.findall("".join(lines)))
        attached = [cid for cid, kind in kinds if kind == "attach" and cid not in gvisor]
        why = [line for line in lines if "agent channel of" in line and "attach" in line]
        assert not attached, f"runc channels over the attach: {attached}: {why}"
        if kinds:
            print(f"\nagent channels over the socket: {len(kinds)}")


@pytest.fixture(scope="module")
def server(
    _servers: dict[str, ServerProcess], tier: str, tmp_path_factory: pytest.TempPathFactory
) -> ServerProcess:
    if tier not in _servers:
        owner = "test" + secrets.token_hex(4)
        extra = ("--isolation-default", tier) if tier != "runc" else ()
        _servers[tier] = start_server(tmp_path_factory.mktemp("data"), owner, *extra)
    return _servers[tier]


@dataclass
class Stubs:
    channel: grpc.Channel
    sessions: session_pb2_grpc.SessionServiceStub
    processes: process_pb2_grpc.ProcessServiceStub
    files: filesystem_pb2_grpc.FilesystemServiceStub
    admin: admin_pb2_grpc.AdminServiceStub


def make_stubs(address: str) -> Stubs:
    channel = grpc.insecure_channel(
        address,
        options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ],
    )
    return Stubs(
        channel,
        session_pb2_grpc.SessionServiceStub(channel),
        process_pb2_grpc.ProcessServiceStub(channel),
        filesystem_pb2_grpc.FilesystemServiceStub(channel),
        admin_pb2_grpc.AdminServiceStub(channel),
    )


@pytest.fixture(scope="session")
def _stubs_by_address() -> Iterator[dict[str, Stubs]]:
    made: dict[str, Stubs] = {}
    yield made
    for s in made.values():
        s.channel.close()


@pytest.fixture(scope="module")
def stubs(server: ServerProcess, _stubs_by_address: dict[str, Stubs]) -> Stubs:
    if server.address not in _stubs_by_address:
        _stubs_by_address[server.address] = make_stubs(server.address)
    return _stubs_by_address[server.address]


SessionFactory = Callable[..., session_pb2.Session]


@pytest.fixture
def new_session(stubs: Stubs) -> Iterator[SessionFactory]:
    """Create sessions (every command allowed unless `shell` is given); deleted afterwards."""
    created: list[str] = []

    def make(**fields: object) -> session_pb2.Session:
        fields.setdefault("shell", common_pb2.ShellPolicy(allow_all=True))
        resp = stubs.sessions.CreateSession(session_pb2.CreateSessionRequest(**fields))  # type: ignore[arg-type]
        created.append(resp.session.session_id)
        return resp.session

    yield make
    for sid in created:
        with contextlib.suppress(grpc.RpcError):
            stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


@pytest.fixture(scope="module")
def shared_session(stubs: Stubs) -> Iterator[session_pb2.Session]:
    """One session per test module for tests that only read or write their own files."""
    resp = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
    )
    yield resp.session
    with contextlib.suppress(grpc.RpcError):
        stubs.sessions.DeleteSession(
            session_pb2.DeleteSessionRequest(session_id=resp.session.session_id)
        )


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    """The google.rpc.ErrorInfo detail the server attached to a failed call."""
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None, f"no rich status on {err}"
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError(f"no ErrorInfo on {err}")


def expect_error(
    call: Callable[[], object], code: grpc.StatusCode, reason: str | None = None
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as excinfo:
        result = call()
        if hasattr(result, "__iter__") and not isinstance(result, bytes | str):
            list(result)  # type: ignore[call-overload]  # a server stream fails when read
    err = excinfo.value
    assert err.code() == code, f"{err.code()} {err.details()}"  # type: ignore[attr-defined]
    if reason is not None:
        assert error_info(err).reason == reason, err.details()  # type: ignore[attr-defined]
        assert error_info(err).domain == "sandboxd"
    return err


def run(stubs: Stubs, session_id: str, *argv: str, **fields: object) -> process_pb2.RunResponse:
    return stubs.processes.Run(  # type: ignore[no-any-return]
        process_pb2.RunRequest(session_id=session_id, argv=list(argv), **fields)  # type: ignore[arg-type]
    )


def run_after_death(
    stubs: Stubs, session_id: str, script: str, *, within: float = 60.0
) -> process_pb2.RunResponse:
    """The first call after a sandbox died: its calls answer UNAVAILABLE (CONTAINER_REBUILDING,
    retryable) until it is rebuilt: tried for `within` seconds, each try with that deadline."""
    end = time.monotonic() + within
    while True:
        try:
            return stubs.processes.Run(  # type: ignore[no-any-return]
                process_pb2.RunRequest(session_id=session_id, argv=["sh", "-c", script]),
                timeout=within,
            )
        except grpc.RpcError as err:
            if err.code() is not grpc.StatusCode.UNAVAILABLE or time.monotonic() > end:  # type: ignore[attr-defined]
                raise
            time.sleep(0.2)


def rss_bytes(pid: int) -> int:
    """The resident memory of process `pid` (VmRSS), for tests that bound what a process keeps."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def first_difference(got: bytes, want: bytes) -> int:
    """Where `got` first differs from `want` (the shorter one's length when one is a prefix),
    for a failure message about a long output."""
    return next(
        (k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
        min(len(got), len(want)),
    )


def wait_until(predicate: Callable[[], bool], timeout: float = 10, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
