"""Background processes against the real engine: StartProcess, AttachProcess (replay by offset,
gaps, late exit), ListProcesses, SignalProcess, lifetime, and their bad input."""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator

import grpc
import pytest
from conftest import (
    SessionFactory,
    Stubs,
    expect_error,
    make_stubs,
    remove_owned_containers,
    run,
    start_server,
    wait_until,
)
from containers import session_container, session_containers
from google.protobuf import duration_pb2
from sandboxd.v1 import common_pb2, process_pb2, session_pb2

P = process_pb2


def start_process(stubs: Stubs, sid: str, *argv: str, **fields: object) -> P.Process:
    fields.setdefault("timeout", duration_pb2.Duration(seconds=60))
    request = P.StartProcessRequest(session_id=sid, argv=list(argv), **fields)  # type: ignore[arg-type]
    return stubs.processes.StartProcess(request).process  # type: ignore[no-any-return]


def attach(
    stubs: Stubs, sid: str, pid: str, stdout_offset: int = 0, stderr_offset: int = 0
) -> list[P.AttachProcessResponse]:
    request = P.AttachProcessRequest(
        session_id=sid, process_id=pid, stdout_offset=stdout_offset, stderr_offset=stderr_offset
    )
    return list(stubs.processes.AttachProcess(request, timeout=60))


def collected(events: list[P.AttachProcessResponse], stream: int) -> bytes:
    return b"".join(
        e.output.data for e in events if e.HasField("output") and e.output.stream == stream
    )


def wait_exited(stubs: Stubs, sid: str, pid: str, timeout: float = 20) -> P.Process:
    def done() -> bool:
        return get(stubs, sid, pid).state == P.PROCESS_STATE_EXITED

    assert wait_until(done, timeout=timeout, interval=0.05)
    return get(stubs, sid, pid)


def get(stubs: Stubs, sid: str, pid: str) -> P.Process:
    procs = stubs.processes.ListProcesses(P.ListProcessesRequest(session_id=sid)).processes
    (found,) = [p for p in procs if p.process_id == pid]
    return found


def _alive(stubs: Stubs, sid: str, marker: str) -> bool:
    ps = run(stubs, sid, "ps", "-o", "pid,args").stdout.decode()
    return any(marker in line and "ps -o" not in line for line in ps.splitlines())


def test_start_outlives_the_call_and_attach_replays(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    proc = start_process(
        stubs, sid, "sh", "-c", "echo one; echo err >&2; sleep 1; echo two; sleep 700"
    )
    assert proc.state == P.PROCESS_STATE_RUNNING and proc.process_id.startswith("p-")
    assert list(proc.argv) == ["sh", "-c", "echo one; echo err >&2; sleep 1; echo two; sleep 700"]
    assert proc.started_at.seconds > 0
    # The call has returned; the process lives on.
    time.sleep(1.5)
    assert _alive(stubs, sid, "sleep 700")
    listed = get(stubs, sid, proc.process_id)
    assert listed.state == P.PROCESS_STATE_RUNNING
    assert (listed.stdout_bytes, listed.stderr_bytes) == (8, 4)
    stubs.processes.SignalProcess(
        P.SignalProcessRequest(session_id=sid, process_id=proc.process_id, signal="SIGKILL")
    )
    events = attach(stubs, sid, proc.process_id)
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "started" and kinds[-1] == "exited", kinds
    assert events[0].started.process_id == proc.process_id
    assert collected(events, P.OUTPUT_STREAM_STDOUT) == b"one\ntwo\n"
    assert collected(events, P.OUTPUT_STREAM_STDERR) == b"err\n"
    assert events[-1].exited.signal == "SIGKILL"
    assert not _alive(stubs, sid, "sleep 700")
    # The exit record is kept: a late caller still gets the output and `exited`.
    late = attach(stubs, sid, proc.process_id, stdout_offset=4)
    assert collected(late, P.OUTPUT_STREAM_STDOUT) == b"two\n"
    assert late[-1].exited.exit_code == 128 + 9


def test_replay_from_offsets_and_live_follow(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    run(stubs, sid, "mkfifo", "f")
    script = "echo a1; echo b1 >&2; read x < f; echo a2; echo b2 >&2"
    proc = start_process(stubs, sid, "sh", "-c", script)
    assert wait_until(lambda: get(stubs, sid, proc.process_id).stderr_bytes == 3)
    request = P.AttachProcessRequest(
        session_id=sid, process_id=proc.process_id, stdout_offset=1, stderr_offset=3
    )
    call = stubs.processes.AttachProcess(request, timeout=30)
    first = next(call)
    assert first.started.process_id == proc.process_id
    out = next(call).output
    assert (out.stream, out.offset, out.data) == (P.OUTPUT_STREAM_STDOUT, 1, b"1\n")
    run(stubs, sid, "sh", "-c", "echo go > f")
    rest = list(call)
    assert collected(rest, P.OUTPUT_STREAM_STDOUT) == b"a2\n"
    assert collected(rest, P.OUTPUT_STREAM_STDERR) == b"b2\n"
    offsets = [(e.output.stream, e.output.offset) for e in rest if e.HasField("output")]
    assert sorted(offsets) == [(P.OUTPUT_STREAM_STDOUT, 3), (P.OUTPUT_STREAM_STDERR, 3)]
    assert rest[-1].exited.exit_code == 0


def test_output_that_left_the_buffer_is_reported_as_a_gap(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    proc = start_process(stubs, sid, "sh", "-c", "seq 1 3000; echo tail >&2", max_output_bytes=1000)
    done = wait_exited(stubs, sid, proc.process_id)
    total = len(b"".join(b"%d\n" % i for i in range(1, 3001)))
    assert done.stdout_bytes == total and done.stdout_first_offset == total - 1000
    assert not done.exited.truncated  # a background process is never cut, only forgotten
    events = attach(stubs, sid, proc.process_id)
    gaps = [e.gap for e in events if e.HasField("gap")]
    assert len(gaps) == 1
    assert (gaps[0].stream, gaps[0].offset, gaps[0].length) == (
        P.OUTPUT_STREAM_STDOUT,
        0,
        total - 1000,
    )
    stdout = collected(events, P.OUTPUT_STREAM_STDOUT)
    assert len(stdout) == 1000 and stdout.endswith(b"2999\n3000\n")
    first_out = next(e.output for e in events if e.HasField("output") and e.output.stream == 1)
    assert first_out.offset == total - 1000
    assert collected(events, P.OUTPUT_STREAM_STDERR) == b"tail\n"
    # From the exact end: nothing to replay, just the exit.
    end = attach(stubs, sid, proc.process_id, stdout_offset=total, stderr_offset=5)
    assert [e.WhichOneof("event") for e in end] == ["started", "exited"]


def test_start_is_idempotent_by_process_id(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    a = start_process(stubs, sid, "sleep", "30", process_id="server-1")
    b = start_process(stubs, sid, "sleep", "30", process_id="server-1")
    assert a.process_id == b.process_id == "server-1"
    assert a.started_at == b.started_at
    assert len(stubs.processes.ListProcesses(P.ListProcessesRequest(session_id=sid)).processes) == 1
    expect_error(
        lambda: start_process(stubs, sid, "sleep", "31", process_id="server-1"),
        grpc.StatusCode.ALREADY_EXISTS,
        "PROCESS_ALREADY_EXISTS",
    )


def test_signal_goes_to_the_process_group(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    script = "sleep 701 & trap 'echo bye; exit 4' TERM; echo ready; while :; do sleep 0.1; done"
    proc = start_process(stubs, sid, "sh", "-c", script, process_id="svc")
    assert wait_until(lambda: get(stubs, sid, "svc").stdout_bytes > 0)
    assert _alive(stubs, sid, "sleep 701")
    stubs.processes.SignalProcess(
        P.SignalProcessRequest(session_id=sid, process_id=proc.process_id, signal="SIGTERM")
    )
    done = wait_exited(stubs, sid, "svc")
    assert done.exited.exit_code == 4
    assert not _alive(stubs, sid, "sleep 701")
    expect_error(
        lambda: stubs.processes.SignalProcess(
            P.SignalProcessRequest(session_id=sid, process_id="svc", signal="SIGTERM")
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "PROCESS_EXITED",
    )


def test_timeout_applies_to_background_processes(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    proc = start_process(stubs, sid, "sleep", "30", timeout=duration_pb2.Duration(seconds=1))
    done = wait_exited(stubs, sid, proc.process_id, timeout=5)
    assert done.exited.timed_out and done.exited.signal == "SIGKILL"


def test_a_stalled_reader_does_not_stall_the_process_or_other_readers(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    run(stubs, sid, "mkfifo", "f")
    start_process(
        stubs,
        sid,
        "sh",
        "-c",
        "read x < f; yes 0123456789abcdef | head -c 32000000; echo end >&2",
        max_output_bytes=1024 * 1024,
        process_id="loud",
    )
    # A reader that attaches and then never reads (until the end). With the agent it holds at
    # most its agent stream's window (agent_window_max) and gRPC's buffers: 32 MB is beyond.
    stalled = stubs.processes.AttachProcess(
        P.AttachProcessRequest(session_id=sid, process_id="loud"), timeout=60
    )
    assert next(stalled).HasField("started")
    started = time.monotonic()
    run(stubs, sid, "sh", "-c", "echo go > f")
    done = wait_exited(stubs, sid, "loud", timeout=30)
    assert done.exited.exit_code == 0
    assert done.stdout_bytes == 32_000_000
    assert time.monotonic() - started < 20
    events = attach(stubs, sid, "loud")
    assert collected(events, P.OUTPUT_STREAM_STDERR) == b"end\n"
    assert len(collected(events, P.OUTPUT_STREAM_STDOUT)) == 1024 * 1024
    # The stalled reader, read at last, is told what it missed and still gets the exit.
    rest = list(stalled)
    gap = sum(e.gap.length for e in rest if e.HasField("gap"))
    got = len(collected(rest, P.OUTPUT_STREAM_STDOUT))
    assert gap > 0 and gap + got == 32_000_000
    assert rest[-1].HasField("exited")


def test_delete_session_ends_background_processes(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    start_process(stubs, sid, "sleep", "702", process_id="bg")
    assert wait_until(lambda: _alive(stubs, sid, "sleep 702"))
    stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
    expect_error(
        lambda: stubs.processes.ListProcesses(P.ListProcessesRequest(session_id=sid)),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    )
    assert session_containers(sid) == []


def test_exec_children_do_not_outlive_but_started_processes_do(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    run(stubs, sid, "sh", "-c", "sleep 703 & echo bye")
    start_process(stubs, sid, "sh", "-c", "sleep 704 & sleep 705")
    assert wait_until(lambda: _alive(stubs, sid, "sleep 704") and _alive(stubs, sid, "sleep 705"))
    assert not _alive(stubs, sid, "sleep 703")


# ----- bad input ------------------------------------------------------------------------------


def test_attach_bad_input(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    start_process(stubs, sid, "echo", "12345", process_id="short")
    wait_exited(stubs, sid, "short")
    expect_error(
        lambda: attach(stubs, sid, "no-such-process"),
        grpc.StatusCode.NOT_FOUND,
        "PROCESS_NOT_FOUND",
    )
    expect_error(
        lambda: attach(stubs, sid, "short", stdout_offset=7),
        grpc.StatusCode.OUT_OF_RANGE,
        "OFFSET_OUT_OF_RANGE",
    )
    expect_error(
        lambda: attach(stubs, sid, "short", stderr_offset=1),
        grpc.StatusCode.OUT_OF_RANGE,
        "OFFSET_OUT_OF_RANGE",
    )
    expect_error(
        lambda: attach(stubs, sid, "short", stdout_offset=-1),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_OFFSET",
    )
    assert collected(attach(stubs, sid, "short", stdout_offset=6), 1) == b""
    expect_error(
        lambda: attach(stubs, "no-such-session", "short"),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    )


@pytest.mark.parametrize("name", ["SIGBOGUS", "", "9", "sigterm", "KILL", "SIGSEGV"])
def test_signal_process_bad_signal(
    stubs: Stubs, shared_session: session_pb2.Session, name: str
) -> None:
    sid = shared_session.session_id
    proc = start_process(stubs, sid, "sleep", "5")
    expect_error(
        lambda: stubs.processes.SignalProcess(
            P.SignalProcessRequest(session_id=sid, process_id=proc.process_id, signal=name)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_SIGNAL",
    )


def test_signal_unknown_process(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    expect_error(
        lambda: stubs.processes.SignalProcess(
            P.SignalProcessRequest(
                session_id=shared_session.session_id, process_id="nope", signal="SIGTERM"
            )
        ),
        grpc.StatusCode.NOT_FOUND,
        "PROCESS_NOT_FOUND",
    )


@pytest.mark.parametrize(
    ("fields", "code", "reason"),
    [
        ({"process_id": "Bad Id"}, "INVALID_ARGUMENT", "INVALID_PROCESS_ID"),
        ({"process_id": "-x"}, "INVALID_ARGUMENT", "INVALID_PROCESS_ID"),
        ({"process_id": "x" * 64}, "INVALID_ARGUMENT", "INVALID_PROCESS_ID"),
        ({"argv": []}, "INVALID_ARGUMENT", "INVALID_ARGV"),
        ({"argv": ["/tmp/x"]}, "INVALID_ARGUMENT", "INVALID_ARGV"),
        ({"cwd": "/etc"}, "INVALID_ARGUMENT", "PATH_OUTSIDE_WORKSPACE"),
        ({"max_output_bytes": -1}, "INVALID_ARGUMENT", "INVALID_OUTPUT_CAP"),
        (
            {"timeout": duration_pb2.Duration(seconds=10**6)},
            "INVALID_ARGUMENT",
            "LIMIT_EXCEEDS_MAXIMUM",
        ),
    ],
)
def test_start_process_bad_input(
    stubs: Stubs,
    shared_session: session_pb2.Session,
    fields: dict[str, object],
    code: str,
    reason: str,
) -> None:
    fields = {"argv": ["true"], **fields}
    request = P.StartProcessRequest(session_id=shared_session.session_id, **fields)  # type: ignore[arg-type]
    expect_error(
        lambda: stubs.processes.StartProcess(request), getattr(grpc.StatusCode, code), reason
    )


def test_start_process_command_not_allowed(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session(shell=common_pb2.ShellPolicy(allow=["echo"])).session_id
    expect_error(
        lambda: start_process(stubs, sid, "sh", "-c", "true"),
        grpc.StatusCode.PERMISSION_DENIED,
        "COMMAND_NOT_ALLOWED",
    )


# ----- keepalive on AttachProcess (a server of its own with a short interval) ---------------


@pytest.fixture(scope="module")
def fast_keepalive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stubs]:
    owner = "testka" + secrets.token_hex(3)
    srv = start_server(tmp_path_factory.mktemp("ka"), owner, "--keepalive-interval-s", "200ms")
    stubs = make_stubs(srv.address)
    try:
        yield stubs
    finally:
        stubs.channel.close()
        srv.stop()
        remove_owned_containers(owner)


@pytest.mark.serial  # its attach must come within the 1 s the command runs: run alone
def test_attach_sends_keepalives_while_quiet(fast_keepalive: Stubs) -> None:
    stubs = fast_keepalive
    sid = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
    ).session.session_id
    try:
        proc = start_process(stubs, sid, "sh", "-c", "sleep 1; echo done")
        events = attach(stubs, sid, proc.process_id)
        kinds = [e.WhichOneof("event") for e in events]
        assert kinds.count("keepalive") >= 2 and kinds[-1] == "exited", kinds
        assert collected(events, P.OUTPUT_STREAM_STDOUT) == b"done\n"
    finally:
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


def test_server_shutdown_ends_background_processes(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    owner = "testsd" + secrets.token_hex(3)
    srv = start_server(tmp_path_factory.mktemp("sd"), owner)
    stubs = make_stubs(srv.address)
    try:
        sid = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
        ).session.session_id
        start_process(stubs, sid, "sleep", "706")
        assert wait_until(lambda: _alive(stubs, sid, "sleep 706"))
        container = session_container(sid, running=True)
        stubs.channel.close()
        assert srv.stop() == 0
        top = subprocess.run(
            ["docker", "top", container], capture_output=True, text=True, check=False
        ).stdout
        assert "sleep 706" not in top, top
    finally:
        srv.stop()
        remove_owned_containers(owner)
