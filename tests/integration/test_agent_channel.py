"""The agent channel on the real engine (docs/agent.md): commands run by the agent
(PID 1, the session's uid, no `docker exec`), a server killed and started again re-attaches,
and an agent that stops answering is rescued with a clear error and a working session."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from conftest import (
    SessionFactory,
    Stubs,
    error_info,
    make_stubs,
    remove_owned_containers,
    run,
    start_server,
    wait_until,
)
from containers import agent_cmd, session_container
from sandboxd.v1 import common_pb2, session_pb2

TIERS = ("runc", "gvisor")  # the same agent under both (sbx agent --user, docs/agent.md)


def _tier(tier: str) -> tuple[str, ...]:
    """start_server's arguments for a server whose sessions run under `tier`."""
    return ("--isolation-default", tier) if tier != "runc" else ()


def _inspect(cid: str) -> dict[str, object]:
    out = subprocess.run(
        ["docker", "inspect", cid], capture_output=True, text=True, check=True
    ).stdout
    doc = json.loads(out)[0]
    assert isinstance(doc, dict)
    return doc


def _exec_ids(cid: str) -> list[str]:
    return list(_inspect(cid).get("ExecIDs") or [])  # type: ignore[call-overload]


def test_the_agent_is_pid_1_and_runs_commands_without_docker_exec(
    stubs: Stubs, server: object, new_session: SessionFactory, tier: str
) -> None:
    s = new_session()
    owner = server.owner_id  # type: ignore[attr-defined]
    cid = session_container(s.session_id, owner)
    doc = _inspect(cid)
    config, host = doc["Config"], doc["HostConfig"]
    # Commands as the session's uid:gid, not a keeper's; the agent itself as root with three
    # capabilities (tests/integration/test_agent_identity.py).
    want = agent_cmd(s.user, tier)  # with the socket channel's flag when it has it
    assert config["Cmd"] == want  # type: ignore[index]
    assert config["User"] == "0:0"  # type: ignore[index]
    assert config["OpenStdin"] is True and config["StdinOnce"] is False  # type: ignore[index]
    assert host["Init"] is False  # type: ignore[index]
    # The command's parent is PID 1, the agent, which is its supervisor too (no `sbx run`
    # process between them: helper/agent_run.c).
    r = run(
        stubs,
        s.session_id,
        "/bin/sh",
        "-c",
        'ppid() { sed -n "s/^PPid:\\t//p" /proc/$1/status; }; '
        "echo $(ppid $$) $(tr '\\0' ' ' < /proc/1/cmdline)",
    )
    assert r.exit_code == 0, r.stderr
    parent, *cmdline = r.stdout.decode().split()
    assert cmdline == want
    assert parent == "1"
    # No `docker exec` was made for any of it (the engine lists every exec of a container).
    assert _exec_ids(cid) == []
    # Large output crosses the channel whole.
    big = run(stubs, s.session_id, "/bin/sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x")
    assert big.stdout == b"x" * len(big.stdout) and len(big.stdout) >= 1 << 20
    assert _exec_ids(cid) == []


def test_a_server_killed_and_started_again_reattaches(tmp_path: Path, tier: str) -> None:
    owner = "t-agent-restart-" + str(int(time.time()))
    data = tmp_path / "data"
    srv = start_server(data, owner, *_tier(tier))
    try:
        stubs = make_stubs(f"127.0.0.1:{srv.port}")
        sid = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
        ).session.session_id
        assert run(stubs, sid, "/bin/sh", "-c", "echo before > /workspace/f").exit_code == 0
        cid = session_container(sid, owner)
        srv.stop(signal.SIGKILL)
        srv = start_server(data, owner, *_tier(tier))
        stubs = make_stubs(f"127.0.0.1:{srv.port}")
        r = run(stubs, sid, "/bin/cat", "/workspace/f")
        assert r.exit_code == 0 and r.stdout == b"before\n", r
        assert _exec_ids(cid) == []  # re-attached to the same agent, no docker exec
        # The agent kept running all along: the same container start.
        assert _inspect(cid)["State"]["Running"] is True  # type: ignore[index]
    finally:
        srv.stop()
        remove_owned_containers(owner)


def test_an_agent_that_stops_answering_is_rescued(tmp_path: Path, tier: str) -> None:
    """SIGSTOP to the agent from the engine (the one sender a command cannot be: PID 1 ignores
    every signal from inside its namespace): the call in flight fails with AGENT_UNAVAILABLE,
    the server kills the sandbox user's processes and wakes the agent, and the session works."""
    owner = "t-agent-rescue-" + str(int(time.time()))
    srv = start_server(
        tmp_path / "data",
        owner,
        "--agent-keepalive",
        "0.5s",
        "--agent-handshake",
        "2s",
        *_tier(tier),
    )
    try:
        stubs = make_stubs(f"127.0.0.1:{srv.port}")
        sid = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
        ).session.session_id
        cid = session_container(sid, owner)
        assert run(stubs, sid, "/bin/sh", "-c", "echo kept > /workspace/f").exit_code == 0
        subprocess.run(["docker", "kill", "-s", "STOP", cid], check=True, capture_output=True)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            run(stubs, sid, "/bin/true")
        err = caught.value
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err.details()  # type: ignore[attr-defined]
        assert error_info(err).reason == "AGENT_UNAVAILABLE"
        assert time.monotonic() - started < 10  # two keepalive periods, not a hang

        def works() -> bool:
            try:
                return run(stubs, sid, "/bin/cat", "/workspace/f").stdout == b"kept\n"
            except grpc.RpcError:
                return False

        assert wait_until(works, timeout=30, interval=0.5), srv.log()[-3000:]
        assert any("does not answer" in line for line in srv.log_lines)
        assert any("answers again" in line for line in srv.log_lines)
    finally:
        srv.stop()
        remove_owned_containers(owner)


def test_signals_from_inside_leave_the_agent_running(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    """`kill -STOP -1`, `kill -STOP 1`, `kill -9 1` as the sandbox user (the agent's own uid):
    the kernel drops them for PID 1 of the namespace, and the session keeps working."""
    sid = new_session().session_id
    run(stubs, sid, "/bin/sh", "-c", "kill -STOP -1; kill -STOP 1; kill -KILL 1; kill -9 -1")
    r = run(stubs, sid, "/bin/sh", "-c", "echo alive; grep State /proc/1/status")
    assert r.stdout.startswith(b"alive\n") and b"stopped" not in r.stdout, r.stdout


def test_a_command_running_when_the_server_dies_is_killed(tmp_path: Path, tier: str) -> None:
    """Server SIGKILL during an Exec: the agent's keepalive ends the epoch and with it every
    non-detached command (its whole tree); after a restart nothing of it is left."""
    import threading

    owner = "t-agent-orphan-" + str(int(time.time()))
    data = tmp_path / "data"
    srv = start_server(data, owner, *_tier(tier))
    try:
        stubs = make_stubs(f"127.0.0.1:{srv.port}")
        sid = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
        ).session.session_id
        caught: list[grpc.RpcError] = []

        def long_run() -> None:
            try:
                run(stubs, sid, "/bin/sh", "-c", "sleep 4243 & sleep 4242")
            except grpc.RpcError as err:
                caught.append(err)

        thread = threading.Thread(target=long_run, daemon=True)
        thread.start()
        cid = session_container(sid, owner)

        def processes() -> str:
            # `docker top` of a runsc container lists the host's processes, not the sandbox's.
            ps = ["docker", "exec", "-u", "65534:65534", cid, "ps", "-o", "args"]
            return subprocess.run(ps, capture_output=True, text=True).stdout

        def running() -> bool:
            return "sleep 4242" in processes()

        assert wait_until(running, timeout=10)
        srv.stop(signal.SIGKILL)
        thread.join(10)
        assert caught and caught[0].code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
        # Two keepalive periods (the agent's: 2 x 5 s) and the command's tree is gone.
        assert wait_until(lambda: not running(), timeout=20)
        assert "sleep 4243" not in processes()
        srv = start_server(data, owner, *_tier(tier))
        stubs = make_stubs(f"127.0.0.1:{srv.port}")
        assert run(stubs, sid, "/bin/true").exit_code == 0
    finally:
        srv.stop()
        remove_owned_containers(owner)


def test_background_processes_outlive_a_server_sigkill(tmp_path: Path, tier: str) -> None:
    """A background process keeps running through a server SIGKILL and a
    restart; ListProcesses shows it, AttachProcess from 0 replays its whole output and follows
    it live, SignalProcess works, and its exit is recorded."""
    from google.protobuf import duration_pb2
    from sandboxd.v1 import process_pb2 as P

    owner = "t-agent-bg-" + str(int(time.time()))
    data = tmp_path / "data"
    detached = ("--agent-detached-processes", "true")
    srv = start_server(data, owner, *detached, *_tier(tier))
    try:
        stubs = make_stubs(f"127.0.0.1:{srv.port}")
        sid = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
        ).session.session_id
        minute = duration_pb2.Duration(seconds=60)
        script = "echo before; sleep 4; echo after; echo oops >&2; exit 7"
        stubs.processes.StartProcess(
            P.StartProcessRequest(
                session_id=sid, process_id="bg-a", argv=["sh", "-c", script], timeout=minute
            )
        )
        stubs.processes.StartProcess(
            P.StartProcessRequest(
                session_id=sid, process_id="bg-b", argv=["sleep", "300"], timeout=minute
            )
        )
        time.sleep(0.5)
        srv.stop(signal.SIGKILL)
        srv = start_server(data, owner, *detached, *_tier(tier))
        stubs = make_stubs(f"127.0.0.1:{srv.port}")

        def listed() -> dict[str, P.Process]:
            req = P.ListProcessesRequest(session_id=sid)
            return {p.process_id: p for p in stubs.processes.ListProcesses(req).processes}

        assert wait_until(lambda: {"bg-a", "bg-b"} <= set(listed()), timeout=20), srv.log()
        procs = listed()
        assert procs["bg-b"].state == P.PROCESS_STATE_RUNNING
        assert list(procs["bg-b"].argv) == ["sleep", "300"]
        events = list(
            stubs.processes.AttachProcess(
                P.AttachProcessRequest(session_id=sid, process_id="bg-a"), timeout=30
            )
        )
        out = b"".join(
            e.output.data for e in events if e.HasField("output") and e.output.stream == 1
        )
        err = b"".join(
            e.output.data for e in events if e.HasField("output") and e.output.stream == 2
        )
        assert out == b"before\nafter\n" and err == b"oops\n", events
        assert events[-1].exited.exit_code == 7
        stubs.processes.SignalProcess(
            P.SignalProcessRequest(session_id=sid, process_id="bg-b", signal="SIGTERM")
        )
        assert wait_until(lambda: listed()["bg-b"].state == P.PROCESS_STATE_EXITED, timeout=10)
        assert listed()["bg-b"].exited.signal == "SIGTERM"
    finally:
        srv.stop()
        remove_owned_containers(owner)
