"""A restart changes nothing a caller can see of a background process: a server SIGKILLed while
timed background processes run, and started again, adopts each with the deadline it started
with (not a fresh timeout counted from the restart), its real start time and duration, and
records a kill by its deadline as timed out by SIGKILL, whether the kill comes from the new
server or came from the supervisor's backstop while no server was there.

Timing assertions are about order (before the fresh deadline a restart would have counted,
after the original one), with margins of seconds, never about speed.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiodocker
import grpc
import pytest
from conftest import (
    ServerProcess,
    Stubs,
    make_stubs,
    remove_owned_containers,
    run_after_death,
    start_server,
    wait_until,
)
from google.protobuf import duration_pb2
from sandboxd.v1 import (
    common_pb2,
    events_pb2,
    process_pb2,
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

CALL_TIMEOUT = 60.0
SOAK_SECONDS = float(os.environ.get("SANDBOXD_SOAK_SECONDS", "0"))
GRACE_S = 2.0  # execution.SUPERVISOR_GRACE_S: the supervisor's backstop past the deadline


@dataclass
class Restartable:
    """A server of its own (a data dir and owner id) that a test SIGKILLs and starts again."""

    tmp: Path
    owner: str
    srv: ServerProcess
    stubs: Stubs

    def sigkill_and_restart(self, outage_s: float = 0.0) -> float:
        """SIGKILL the server, wait `outage_s`, start it again; when it answers (monotonic)."""
        self.srv.stop(signal.SIGKILL)
        self.stubs.channel.close()
        time.sleep(outage_s)
        self.srv = start_server(self.tmp, self.owner)
        self.stubs = make_stubs(self.srv.address)
        return time.monotonic()


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[Restartable]:
    owner = "rst" + secrets.token_hex(4)
    srv = start_server(tmp_path, owner)
    box = Restartable(tmp_path, owner, srv, make_stubs(srv.address))
    try:
        yield box
    finally:
        box.stubs.channel.close()
        box.srv.stop()
        remove_owned_containers(owner)


def snaps(stubs: Stubs) -> snapshot_pb2_grpc.SnapshotServiceStub:
    return snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)


def new_session(stubs: Stubs) -> str:
    return stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True)),
        timeout=CALL_TIMEOUT,
    ).session.session_id


def start(
    stubs: Stubs, sid: str, pid: str, sleep_s: float, timeout_s: float
) -> process_pb2.Process:
    return stubs.processes.StartProcess(
        process_pb2.StartProcessRequest(
            session_id=sid,
            process_id=pid,
            argv=["sh", "-c", f"echo started; sleep {sleep_s:g}; echo done"],
            timeout=duration_pb2.Duration(seconds=int(timeout_s)),
        ),
        timeout=CALL_TIMEOUT,
    ).process


def get(stubs: Stubs, sid: str, pid: str) -> process_pb2.Process:
    """The process's record. Right after a restart too: calls on a session's processes wait
    for its adoption, never answer NOT_FOUND for a process its agent kept."""
    return stubs.processes.GetProcess(
        process_pb2.GetProcessRequest(session_id=sid, process_id=pid), timeout=CALL_TIMEOUT
    ).process


def wait_exited(
    stubs: Stubs, sid: str, pid: str, within_s: float
) -> tuple[process_pb2.Process, float]:
    """The process's record once it has exited, and when this test first saw it exited."""
    end = time.monotonic() + within_s
    while True:
        proc = get(stubs, sid, pid)
        if proc.state == process_pb2.PROCESS_STATE_EXITED:
            return proc, time.monotonic()
        assert time.monotonic() < end, f"{pid} still running after {within_s}s: {proc}"
        time.sleep(0.2)


def started_s(proc: process_pb2.Process) -> float:
    return proc.started_at.ToNanoseconds() / 1e9


def assert_timed_out(proc: process_pb2.Process, timeout_s: float) -> None:
    """Killed by its deadline: 137, SIGKILL, timed out, and a duration from its real start
    that is at least its timeout and not past the supervisor's backstop (plus slack)."""
    ex = proc.exited
    got = (ex.exit_code, ex.signal, ex.timed_out)
    assert got == (137, "SIGKILL", True), f"not recorded as killed by its deadline: {ex}"
    duration = ex.duration.ToTimedelta().total_seconds()
    assert timeout_s - 0.5 <= duration <= timeout_s + GRACE_S + 1.5, duration


def test_adopted_process_keeps_its_deadline_start_and_duration(restartable: Restartable) -> None:
    """Killed at its first server's deadline, not at restart + timeout; recorded timed out by
    SIGKILL, with its start time unchanged and its duration from that start."""
    box = restartable
    sid = new_session(box.stubs)
    timeout = 12.0
    first = start(box.stubs, sid, "long", 60, timeout)
    started_mono = time.monotonic()
    time.sleep(2)
    restarted = box.sigkill_and_restart()
    adopted = get(box.stubs, sid, "long")
    assert adopted.state == process_pb2.PROCESS_STATE_RUNNING
    assert abs(started_s(adopted) - started_s(first)) < 1.0, (adopted.started_at, first.started_at)
    proc, seen = wait_exited(box.stubs, sid, "long", 3 * timeout)
    assert_timed_out(proc, timeout)
    # Order, with seconds of margin: after the original deadline, well before the one a fresh
    # timeout from the restart would set.
    assert seen >= started_mono + timeout - 0.5
    assert seen < restarted + timeout - 0.5, (seen - started_mono, restarted - started_mono)
    assert abs(started_s(proc) - started_s(first)) < 1.0


def test_deadline_passed_during_the_outage_is_a_timeout(restartable: Restartable) -> None:
    """The deadline passed while no server was there: the supervisor's backstop killed it (or
    the new server kills it at once); either way a timeout by SIGKILL, with its real duration."""
    box = restartable
    sid = new_session(box.stubs)
    timeout = 3.0
    first = start(box.stubs, sid, "short", 60, timeout)
    time.sleep(0.5)
    box.sigkill_and_restart(outage_s=timeout + GRACE_S + 1.5)
    proc, _ = wait_exited(box.stubs, sid, "short", 30)
    assert_timed_out(proc, timeout)
    assert abs(started_s(proc) - started_s(first)) < 1.0


def test_exit_during_the_outage_keeps_its_duration(restartable: Restartable) -> None:
    """A process that ended on its own while no server was there: exit 0, not timed out, its
    duration is its run, not the time since the restart."""
    box = restartable
    sid = new_session(box.stubs)
    start(box.stubs, sid, "quick", 1, 30)
    box.sigkill_and_restart(outage_s=4)
    proc, _ = wait_exited(box.stubs, sid, "quick", 30)
    ex = proc.exited
    assert (ex.exit_code, ex.signal, ex.timed_out) == (0, "", False), ex
    assert 0.5 <= ex.duration.ToTimedelta().total_seconds() < 3.5, ex.duration


@pytest.mark.timeout(0)
def test_restart_model_with_timed_background_processes(restartable: Restartable) -> None:
    """The model: a few timed background processes, some that end on their own and some that
    their deadline ends, and the server SIGKILLed and started again at random moments (one or
    two restarts per round, outages of random length). Each process must end as the model
    says: on its own (exit 0, its own duration) or by its deadline (SIGKILL, timed out, at or
    after its deadline, before the backstop), with its start time unchanged."""
    box = restartable
    rnd = random.Random(None if SOAK_SECONDS else 27)
    end = time.monotonic() + SOAK_SECONDS
    rounds = 0
    while rounds < 2 or time.monotonic() < end:
        rounds += 1
        sid = new_session(box.stubs)
        want: dict[str, tuple[float, float, float]] = {}  # pid: sleep, timeout, started_at
        for i in range(3):
            timeout = float(rnd.randint(3, 9))
            sleep = rnd.choice([1.0, timeout + 20])
            pid = f"r{rounds}-{i}"
            want[pid] = (sleep, timeout, started_s(start(box.stubs, sid, pid, sleep, timeout)))
        for _ in range(rnd.randint(1, 2)):
            time.sleep(rnd.uniform(0, 3))
            box.sigkill_and_restart(outage_s=rnd.uniform(0, 6))
        for pid, (sleep, timeout, started) in want.items():
            proc, _ = wait_exited(box.stubs, sid, pid, 60)
            assert abs(started_s(proc) - started) < 1.0, (pid, proc.started_at)
            if sleep < timeout:
                ex = proc.exited
                assert (ex.exit_code, ex.timed_out) == (0, False), (pid, ex)
                assert ex.duration.ToTimedelta().total_seconds() < sleep + 2.5, (pid, ex)
            else:
                assert_timed_out(proc, timeout)
        box.stubs.sessions.DeleteSession(
            session_pb2.DeleteSessionRequest(session_id=sid), timeout=CALL_TIMEOUT
        )


# ----- a dead sandbox loses its processes, not its files ----------------------------------------


def kill_container(owner: str, sid: str) -> None:
    """What an OOM-killed agent, an engine that killed the container or a host reboot leave:
    the session's container stopped. The agent (PID 1) of this image is no longer the sandbox's
    OOM victim of choice, so the engine's kill stands for every kind of death."""

    async def kill() -> None:
        async with aiodocker.Docker() as docker:
            found = await docker.containers.list(
                all=True,
                filters={"label": [f"io.sandboxd.owner={owner}", f"io.sandboxd.session={sid}"]},
            )
            assert len(found) == 1, found
            await found[0].kill(signal="SIGKILL")

    asyncio.run(kill())


def sh(stubs: Stubs, sid: str, script: str) -> process_pb2.RunResponse:
    return stubs.processes.Run(
        process_pb2.RunRequest(session_id=sid, argv=["sh", "-c", script]), timeout=CALL_TIMEOUT
    )


def session(stubs: Stubs, sid: str) -> session_pb2.Session:
    return stubs.sessions.GetSession(
        session_pb2.GetSessionRequest(session_id=sid), timeout=CALL_TIMEOUT
    ).session


def state_events(stubs: Stubs, sid: str) -> list[events_pb2.SessionEvent]:
    """The session's kept STATE_CHANGED events (the watch replays them, then is cut off)."""
    got: list[events_pb2.SessionEvent] = []
    watch = stubs.sessions.WatchSession(events_pb2.WatchSessionRequest(session_id=sid), timeout=3)
    try:
        for item in watch:
            if item.event.kind == events_pb2.SESSION_EVENT_KIND_STATE_CHANGED:
                got.append(item.event)
    except grpc.RpcError as err:
        assert err.code() is grpc.StatusCode.DEADLINE_EXCEEDED, err
    return got


def test_dead_sandbox_is_rebuilt_from_its_snapshot_and_says_what_was_lost(
    restartable: Restartable,
) -> None:
    box = restartable
    stubs = box.stubs
    sid = new_session(stubs)
    sh(stubs, sid, "mkdir -p d && printf kept > d/saved")
    snap = snaps(stubs).CreateSnapshot(
        snapshot_pb2.CreateSnapshotRequest(session_id=sid), timeout=CALL_TIMEOUT
    )
    sh(stubs, sid, "printf gone > d/unsaved")
    start(stubs, sid, "bg", 600, 600)
    kill_container(box.owner, sid)

    got = run_after_death(stubs, sid, "cat d/saved; test -e d/unsaved && echo unsaved; true")
    assert got.stdout == b"kept", got.stdout  # the snapshot's files, not what came after it
    s = session(stubs, sid)
    assert s.state == session_pb2.SESSION_STATE_RUNNING
    assert s.HasField("lost_time") and s.restored_from == snap.snapshot.snapshot_id
    assert s.restored_state_time == snap.snapshot.created_at
    assert "processes ended" in s.lost_message and snap.snapshot.snapshot_id in s.lost_message
    # Its process died with the sandbox: never reported running on (its record went with the
    # sandbox, or says it exited).
    try:
        proc = stubs.processes.GetProcess(
            process_pb2.GetProcessRequest(session_id=sid, process_id="bg"), timeout=CALL_TIMEOUT
        ).process
        assert proc.state == process_pb2.PROCESS_STATE_EXITED, proc
    except grpc.RpcError as err:
        assert err.code() is grpc.StatusCode.NOT_FOUND, err
    # The feed said it too: a STATE_CHANGED back to RUNNING, naming what came back.
    told = [e for e in state_events(stubs, sid) if e.attributes.get("restored_from")]
    assert told and told[-1].state == "SESSION_STATE_RUNNING", state_events(stubs, sid)
    assert told[-1].attributes["restored_from"] == snap.snapshot.snapshot_id
    assert "lost" in told[-1].message
    # A server started again still says so (the record is durable).
    box.sigkill_and_restart()
    again = session(box.stubs, sid)
    assert (again.restored_from, again.lost_time) == (s.restored_from, s.lost_time)


def test_dead_sandbox_without_a_snapshot_says_its_workspace_is_gone(
    restartable: Restartable,
) -> None:
    box = restartable
    stubs = box.stubs
    sid = new_session(stubs)
    sh(stubs, sid, "printf x > f")
    kill_container(box.owner, sid)
    end = time.monotonic() + 60
    while True:  # the first call (or the sweep) finds it dead
        try:
            sh(stubs, sid, "true")
        except grpc.RpcError as err:
            if err.code() is grpc.StatusCode.FAILED_PRECONDITION:
                break
            assert err.code() is grpc.StatusCode.UNAVAILABLE, err
        assert time.monotonic() < end
        time.sleep(0.2)
    s = session(stubs, sid)
    assert s.state == session_pb2.SESSION_STATE_FAILED
    assert s.HasField("lost_time") and s.restored_from == ""
    assert not s.HasField("restored_state_time")
    assert "no snapshot" in s.lost_message and "workspace" in s.lost_message


def test_checkpoints_rebuild_a_dead_sandbox_that_has_no_snapshot_of_its_own(tmp_path: Path) -> None:
    """With `checkpoint_interval_s` the server keeps each running workspace itself (one
    checkpoint per session, the previous one dropped): a sandbox that dies without any
    CreateSnapshot of its caller is rebuilt from the checkpoint, not lost."""
    owner = "rst" + secrets.token_hex(4)
    srv = start_server(tmp_path, owner, "--checkpoint-interval-s", "1")
    stubs = make_stubs(srv.address)
    try:
        sid = new_session(stubs)
        sh(stubs, sid, "printf kept > f")

        def checkpoints() -> list[str]:
            listed = snaps(stubs).ListSnapshots(
                snapshot_pb2.ListSnapshotsRequest(
                    session_id=sid, label_selector={"io.sandboxd.auto": "checkpoint"}
                ),
                timeout=CALL_TIMEOUT,
            )
            return [s.snapshot_id for s in listed.snapshots]

        assert wait_until(lambda: bool(checkpoints()), timeout=30)
        first = checkpoints()
        # The next one is kept, then the previous one goes: a listing between the two shows
        # both, so wait for the one that replaced it, alone.
        assert wait_until(lambda: len(now := checkpoints()) == 1 and now != first, timeout=30)
        kill_container(owner, sid)
        got = run_after_death(stubs, sid, "cat f")
        assert got.stdout == b"kept"
        s = session(stubs, sid)
        assert s.state == session_pb2.SESSION_STATE_RUNNING and s.restored_from.startswith("snap-")
    finally:
        stubs.channel.close()
        srv.stop()
        remove_owned_containers(owner)
