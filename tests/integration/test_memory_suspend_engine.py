"""Suspend with memory on a real engine under gVisor (a private dockerd in experimental mode:
tests/checkpoint_engine.py), over a real server port.

A background process keeps running across a suspend and a resume, with its handle, its offsets
and its output (AttachProcess from 0 replays all of it and follows it live), ten cycles in a
row; the tmpfs workspace and gVisor's in-memory /tmp come back; a server started again resumes
what the first one suspended; a runc session is refused before anything stops; the checkpoint
goes with the session. Skipped with the reason where a private engine cannot be run here."""

from __future__ import annotations

import json
import queue
import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from checkpoint_engine import CheckpointEngine, unavailable
from conftest import (
    IMAGE,
    ServerProcess,
    Stubs,
    expect_error,
    make_stubs,
    run,
    start_server,
)
from google.protobuf import duration_pb2
from sandboxd.v1 import admin_pb2, common_pb2, process_pb2, session_pb2

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "available"),
]

ALL = common_pb2.ShellPolicy(allow_all=True)
MEMORY = session_pb2.SUSPEND_MODE_MEMORY
COUNTER = "i=0; while :; do echo $i; i=$((i+1)); sleep 0.1; done"


@pytest.fixture(scope="module")
def engine() -> Iterator[CheckpointEngine]:
    e = CheckpointEngine()
    try:
        e.start((IMAGE,))
        yield e
    finally:
        e.stop()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("memdata")


OWNER = "testmem" + secrets.token_hex(3)


def _server(engine: CheckpointEngine, data_dir: Path) -> ServerProcess:
    return start_server(
        data_dir, OWNER, "--docker-host", engine.docker_host, "--isolation-default", "gvisor"
    )


@pytest.fixture(scope="module")
def srv(engine: CheckpointEngine, data_dir: Path) -> Iterator[ServerProcess]:
    server = _server(engine, data_dir)
    yield server
    server.stop()


@pytest.fixture
def stubs(srv: ServerProcess) -> Stubs:
    return make_stubs(srv.address)


def _create(stubs: Stubs, isolation: int = common_pb2.ISOLATION_GVISOR) -> str:
    sid = "mem-" + secrets.token_hex(4)
    stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            session_id=sid,
            image=IMAGE,
            shell=ALL,
            isolation=isolation,  # type: ignore[arg-type]
        ),
        timeout=120,
    )
    return sid


def _start(stubs: Stubs, sid: str, script: str, timeout_s: int = 900) -> str:
    req = process_pb2.StartProcessRequest(session_id=sid, argv=["sh", "-c", script])
    req.timeout.CopyFrom(duration_pb2.Duration(seconds=timeout_s))
    return str(stubs.processes.StartProcess(req, timeout=60).process.process_id)


def _counted(stubs: Stubs, sid: str, pid: str, past: int) -> list[int]:
    """AttachProcess from offset 0 until the counter passes `past`: every number it printed."""
    call = stubs.processes.AttachProcess(
        process_pb2.AttachProcessRequest(session_id=sid, process_id=pid), timeout=120
    )
    out = b""
    try:
        for event in call:
            assert not event.HasField("gap"), event
            if event.HasField("exited"):
                raise AssertionError(f"the process ended: {event.exited}")
            if event.HasField("output") and event.output.stream == process_pb2.OUTPUT_STREAM_STDOUT:
                assert event.output.offset == len(out), "offsets are not continuous"
                out += event.output.data
                numbers = [int(x) for x in re.findall(rb"(\d+)\n", out)]
                if numbers and numbers[-1] > past:
                    return numbers
    finally:
        call.cancel()
    raise AssertionError("the output ended")


def _suspend(stubs: Stubs, sid: str, mode: int = MEMORY) -> session_pb2.Session:
    req = session_pb2.SuspendSessionRequest(session_id=sid, mode=mode)  # type: ignore[arg-type]
    return stubs.sessions.SuspendSession(req, timeout=300).session


def _resume(stubs: Stubs, sid: str) -> session_pb2.Session:
    req = session_pb2.ResumeSessionRequest(session_id=sid)
    return stubs.sessions.ResumeSession(req, timeout=300).session


def test_the_engine_says_it_can(stubs: Stubs) -> None:
    info = stubs.admin.GetServerInfo(admin_pb2.GetServerInfoRequest())
    assert "memory_suspend" in info.features


def test_the_features_say_what_the_engine_can(server: ServerProcess) -> None:
    """The suite's shared server, on the host's engine: `memory_suspend` exactly when that
    engine is in experimental mode with runsc (ensure-docker.sh starts it so; an engine
    already running may not be)."""
    info = make_stubs(server.address).admin.GetServerInfo(admin_pb2.GetServerInfoRequest())
    engine = json.loads(
        subprocess.run(
            ["docker", "info", "--format", "{{json .}}"], capture_output=True, check=True
        ).stdout
    )
    can = bool(engine.get("ExperimentalBuild")) and "runsc" in (engine.get("Runtimes") or {})
    assert ("memory_suspend" in info.features) == can, (info.features, can)


def test_processes_memory_and_workspace_survive(stubs: Stubs) -> None:
    sid = _create(stubs)
    setup = "echo kept > /workspace/w && echo tmp > /tmp/t && head -c 1000000 /dev/urandom > /tmp/r"
    assert run(stubs, sid, "sh", "-c", setup + " && md5sum /tmp/r").exit_code == 0
    digest = run(stubs, sid, "md5sum", "/tmp/r").stdout
    pid = _start(stubs, sid, COUNTER)
    before = _counted(stubs, sid, pid, 5)
    s = _suspend(stubs, sid)
    assert s.state == session_pb2.SESSION_STATE_SUSPENDED
    assert s.suspend_mode == MEMORY
    got = stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=sid)).session
    assert got.suspend_mode == MEMORY
    time.sleep(2)  # paused: the counter does not move
    r = _resume(stubs, sid)
    assert r.state == session_pb2.SESSION_STATE_RUNNING
    assert r.suspend_mode == session_pb2.SUSPEND_MODE_UNSPECIFIED
    after = _counted(stubs, sid, pid, before[-1] + 10)
    assert after == list(range(len(after))), "the counter started over or skipped"
    assert run(stubs, sid, "cat", "/workspace/w", "/tmp/t").stdout == b"kept\ntmp\n"
    assert run(stubs, sid, "md5sum", "/tmp/r").stdout == digest
    listed = stubs.processes.ListProcesses(process_pb2.ListProcessesRequest(session_id=sid))
    RUNNING = process_pb2.PROCESS_STATE_RUNNING
    assert [p.process_id for p in listed.processes if p.state == RUNNING] == [pid]


def _shims(engine: CheckpointEngine) -> int:
    """containerd shims of the private engine's containers still on this host."""
    found = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes()
        except OSError:  # gone meanwhile
            continue
        found += b"containerd-shim" in argv and str(engine.root).encode() in argv
    return found


def test_ten_cycles_in_a_row(stubs: Stubs, engine: CheckpointEngine) -> None:
    sid = _create(stubs)
    pid = _start(stubs, sid, COUNTER)
    seen = _counted(stubs, sid, pid, 2)
    shims = _shims(engine)
    for _ in range(10):
        _suspend(stubs, sid)
        _resume(stubs, sid)
        seen = _counted(stubs, sid, pid, seen[-1] + 2)
    assert seen == list(range(len(seen)))
    # runsc keeps the shim of a restored container that was checkpointed again: ended.
    assert _shims(engine) <= shims, "the removed sandboxes' shims are left on the host"


def test_a_runc_session_is_refused_before_anything_stops(stubs: Stubs) -> None:
    sid = _create(stubs, common_pb2.ISOLATION_RUNC)
    pid = _start(stubs, sid, COUNTER)
    err = expect_error(
        lambda: _suspend(stubs, sid),
        grpc.StatusCode.FAILED_PRECONDITION,
        "MEMORY_SUSPEND_UNSUPPORTED",
    )
    assert "not stopped" in str(err.details())
    got = stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=sid)).session
    assert got.state == session_pb2.SESSION_STATE_RUNNING
    assert _counted(stubs, sid, pid, 3)  # the same process, running on


def test_a_timeout_does_not_count_the_time_suspended(stubs: Stubs) -> None:
    """An 8 s timeout, 2 s run, then 10 s suspended: it is still running after the resume,
    and ends timed out only once it has run 8 s, so at least 18 s after its start."""
    sid = _create(stubs)
    started = time.monotonic()
    pid = _start(stubs, sid, "sleep 1000", timeout_s=8)
    time.sleep(2)
    _suspend(stubs, sid)
    time.sleep(10)  # past its deadline, had the pause counted
    _resume(stubs, sid)
    get = process_pb2.GetProcessRequest(session_id=sid, process_id=pid)
    running = process_pb2.PROCESS_STATE_RUNNING
    time.sleep(2)  # a deadline that counted the pause would have ended it by now
    assert stubs.processes.GetProcess(get).process.state == running
    deadline = time.monotonic() + 30
    while stubs.processes.GetProcess(get).process.state == running:
        assert time.monotonic() < deadline, "the timeout never came"
        time.sleep(0.25)
    assert time.monotonic() - started >= 18, "the time suspended counted"
    exited = stubs.processes.GetProcess(get).process.exited
    assert exited.timed_out and exited.duration.seconds < 12, exited


def test_a_terminal_is_told_to_reattach(stubs: Stubs) -> None:
    """A PTY (Interact) open across a memory suspend ends with a clear answer: the session
    was suspended with its memory, reattach; after the resume a new terminal works."""
    sid = _create(stubs)
    req = process_pb2.ExecRequest(session_id=sid, argv=["sh"])
    start = process_pb2.InteractStart(request=req, pty=process_pb2.PtySize(rows=24, cols=80))
    requests: queue.Queue[process_pb2.InteractRequest | None] = queue.Queue()
    requests.put(process_pb2.InteractRequest(start=start))
    requests.put(process_pb2.InteractRequest(stdin=process_pb2.InteractStdin(data=b"echo hi\n")))
    call = stubs.processes.Interact(iter(requests.get, None), timeout=120)
    out = b""
    for event in call:
        out += event.output.data if event.HasField("output") else b""
        if b"hi" in out:
            break
    _suspend(stubs, sid)
    with pytest.raises(grpc.RpcError) as ended:
        for _ in call:
            pass
    requests.put(None)
    assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION, ended.value
    assert "reattach" in str(ended.value.details()), ended.value.details()
    _resume(stubs, sid)
    assert run(stubs, sid, "echo", "again").stdout == b"again\n"


def test_a_server_started_again_resumes_it_and_delete_removes_it(
    engine: CheckpointEngine, data_dir: Path, srv: ServerProcess
) -> None:
    """Last in the module: it stops the module's server."""
    stubs = make_stubs(srv.address)
    sid = _create(stubs)
    pid = _start(stubs, sid, COUNTER)
    seen = _counted(stubs, sid, pid, 3)
    _suspend(stubs, sid)
    srv.stop()
    again = _server(engine, data_dir)
    try:
        stubs = make_stubs(again.address)
        _resume(stubs, sid)
        after = _counted(stubs, sid, pid, seen[-1] + 5)
        assert after == list(range(len(after)))
        tars = lambda: set((data_dir / "snapshots").glob("*.tar"))  # noqa: E731
        before = tars()
        _suspend(stubs, sid)
        mine = tars() - before  # its checkpoint (and its workspace tar, if that changed)
        assert mine
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
        left = mine & tars()
        assert not left, f"the deleted session's checkpoint is left: {left}"
    finally:
        again.stop()
