"""ProcessService Exec and Run against the real engine."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from conftest import SessionFactory, Stubs, expect_error, run
from google.protobuf import duration_pb2
from sandboxd.v1 import common_pb2, process_pb2, session_pb2

P = process_pb2


def test_run_collects_output_and_exit_code(
    stubs: Stubs, shared_session: session_pb2.Session
) -> None:
    r = run(stubs, shared_session.session_id, "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
    assert not r.timed_out and not r.truncated and r.signal == ""
    assert r.process_id.startswith("p-")
    assert r.duration.ToNanoseconds() > 0


def test_run_absolute_argv0_and_missing_command(
    stubs: Stubs, shared_session: session_pb2.Session
) -> None:
    assert run(stubs, shared_session.session_id, "/bin/echo", "hi").stdout == b"hi\n"
    r = run(stubs, shared_session.session_id, "no-such-command")
    assert r.exit_code == 127
    assert b"no-such-command" in r.stderr


def test_stdin_env_and_cwd(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    sid = shared_session.session_id
    assert run(stubs, sid, "cat", stdin=b"from stdin").stdout == b"from stdin"
    assert run(stubs, sid, "wc", "-c", stdin=b"x" * 200_000).stdout.strip() == b"200000"
    r = run(stubs, sid, "sh", "-c", "echo $GREETING", env={"GREETING": "hello"})
    assert r.stdout == b"hello\n"
    run(stubs, sid, "mkdir", "-p", "sub/dir")
    assert run(stubs, sid, "pwd", cwd="sub/dir").stdout == b"/workspace/sub/dir\n"
    assert run(stubs, sid, "pwd", cwd="/workspace/sub").stdout == b"/workspace/sub\n"
    assert run(stubs, sid, "pwd").stdout == b"/workspace\n"


def test_environment_is_not_inherited(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    env = run(stubs, shared_session.session_id, "env").stdout.decode().splitlines()
    keys = {line.split("=", 1)[0] for line in env}
    assert keys <= {"PATH", "HOME", "LANG", "HOSTNAME", "PWD", "SHLVL"}, keys


def test_exec_streams_before_the_command_ends(
    stubs: Stubs, shared_session: session_pb2.Session
) -> None:
    start = time.monotonic()
    events = stubs.processes.Exec(
        P.ExecRequest(
            session_id=shared_session.session_id,
            argv=["sh", "-c", "echo first; sleep 2; echo second >&2"],
        )
    )
    arrivals: list[tuple[float, P.ExecResponse]] = []
    for ev in events:
        arrivals.append((time.monotonic() - start, ev))
    kinds = [ev.WhichOneof("event") for _, ev in arrivals]
    assert kinds[0] == "started" and kinds[-1] == "exited"
    outputs = [(t, ev.output) for t, ev in arrivals if ev.HasField("output")]
    first_t, first = outputs[0]
    assert first.data == b"first\n" and first.stream == P.OUTPUT_STREAM_STDOUT
    assert first.offset == 0
    last_t, last = outputs[-1]
    assert last.data == b"second\n" and last.stream == P.OUTPUT_STREAM_STDERR
    assert first_t < 1.5 and last_t >= 2.0, (first_t, last_t)
    assert arrivals[-1][1].exited.exit_code == 0


def test_output_offsets_are_per_stream(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    events = list(
        stubs.processes.Exec(
            P.ExecRequest(
                session_id=shared_session.session_id,
                argv=["sh", "-c", "echo aa; echo bbb >&2; sleep 0.1; echo cc; echo d >&2"],
            )
        )
    )
    seen: dict[int, int] = {}
    for ev in events:
        if ev.HasField("output"):
            assert ev.output.offset == seen.get(ev.output.stream, 0)
            seen[ev.output.stream] = ev.output.offset + len(ev.output.data)
    assert seen == {P.OUTPUT_STREAM_STDOUT: 6, P.OUTPUT_STREAM_STDERR: 6}


def _alive(stubs: Stubs, sid: str, marker: str) -> bool:
    ps = run(stubs, sid, "ps", "-o", "pid,args").stdout.decode()
    return any(marker in line and "ps -o" not in line for line in ps.splitlines())


@pytest.mark.serial  # a wall-clock bound of a few seconds: run alone
def test_client_cancel_kills_the_process_group(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    call = stubs.processes.Exec(
        P.ExecRequest(
            session_id=sid,
            argv=["sh", "-c", "sleep 301 & sleep 302 & echo ready; wait"],
            timeout=duration_pb2.Duration(seconds=60),
        )
    )
    for ev in call:
        if ev.HasField("output") and b"ready" in ev.output.data:
            break
    assert _alive(stubs, sid, "sleep 301")
    cancelled_at = time.monotonic()
    call.cancel()
    while _alive(stubs, sid, "sleep 30") and time.monotonic() - cancelled_at < 5:
        time.sleep(0.05)
    elapsed = time.monotonic() - cancelled_at
    assert not _alive(stubs, sid, "sleep 30")
    assert elapsed < 1.0, f"processes outlived the cancelled call by {elapsed:.2f} s"


def test_background_children_do_not_outlive_the_command(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    r = run(
        stubs,
        sid,
        "sh",
        "-c",
        "sleep 401 & setsid sleep 402 & nohup sleep 403 >/dev/null 2>&1 & echo started",
    )
    assert r.stdout == b"started\n" and r.exit_code == 0
    for marker in ("sleep 401", "sleep 402", "sleep 403"):
        assert not _alive(stubs, sid, marker), marker


@pytest.mark.serial  # a wall-clock bound of a few seconds: run alone
def test_timeout_kills_and_reports(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    start = time.monotonic()
    r = run(stubs, sid, "sh", "-c", "sleep 30", timeout=duration_pb2.Duration(seconds=1))
    elapsed = time.monotonic() - start
    assert r.timed_out and r.exit_code == 137 and r.signal == "SIGKILL"
    assert elapsed < 2.0, elapsed
    assert not _alive(stubs, sid, "sleep 30")


def test_session_default_timeout_applies(stubs: Stubs, new_session: SessionFactory) -> None:
    s = new_session(
        limits=common_pb2.ResourceLimits(command_timeout=duration_pb2.Duration(nanos=500_000_000))
    )
    r = run(stubs, s.session_id, "sleep", "5")
    assert r.timed_out


def test_output_cap_truncates_and_kills(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    start = time.monotonic()
    r = run(stubs, sid, "yes")
    assert r.truncated and not r.timed_out
    assert len(r.stdout) == 1024 * 1024
    assert r.signal == "SIGKILL"
    assert time.monotonic() - start < 5
    assert not _alive(stubs, sid, "yes")
    small = run(stubs, sid, "yes", max_output_bytes=10)
    assert small.truncated and small.stdout == b"y\n" * 5


def test_signal_is_reported(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    r = run(stubs, shared_session.session_id, "sh", "-c", "kill -TERM $$")
    assert r.exit_code == 128 + 15 and r.signal == "SIGTERM"


def test_kill_all_by_sandbox_user_keeps_container_and_workspace(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    run(stubs, sid, "sh", "-c", "echo precious > keep")
    run(stubs, sid, "kill", "-9", "-1")
    assert run(stubs, sid, "cat", "keep").stdout == b"precious\n"


def test_concurrent_runs(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    results: dict[int, bytes] = {}

    def worker(i: int) -> None:
        results[i] = run(stubs, shared_session.session_id, "echo", str(i)).stdout

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"{i}\n".encode() for i in range(20)}


@pytest.mark.parametrize(
    ("fields", "code", "reason"),
    [
        ({"argv": []}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGV"),
        ({"argv": [""]}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGV"),
        ({"argv": ["../bin/sh"]}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGV"),
        ({"argv": ["/usr/bin/../bin/sh"]}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGV"),
        ({"argv": ["-c"]}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGV"),
        ({"argv": ["/tmp/x"]}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGV"),
        ({"argv": ["/workspace/tool"]}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGV"),
        ({"argv": ["./tool"]}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGV"),
        ({"argv": ["echo", "a\0b"]}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGV"),
        ({"argv": ["echo"] + ["x"] * 1025}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGV"),
        ({"argv": ["echo", "x" * 70_000]}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGV"),
        (
            {"argv": ["pwd"], "cwd": "/etc"},
            grpc.StatusCode.INVALID_ARGUMENT,
            "PATH_OUTSIDE_WORKSPACE",
        ),
        (
            {"argv": ["pwd"], "cwd": "../"},
            grpc.StatusCode.INVALID_ARGUMENT,
            "PATH_OUTSIDE_WORKSPACE",
        ),
        ({"argv": ["pwd"], "env": {"A-B": "1"}}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ENV"),
        (
            {"argv": ["pwd"], "env": {"https_proxy": "x"}},
            grpc.StatusCode.INVALID_ARGUMENT,
            "ENV_RESERVED",
        ),
        (
            {"argv": ["pwd"], "timeout": duration_pb2.Duration(seconds=10**6)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "LIMIT_EXCEEDS_MAXIMUM",
        ),
        (
            {"argv": ["pwd"], "max_output_bytes": 2 * 1024 * 1024},
            grpc.StatusCode.INVALID_ARGUMENT,
            "LIMIT_EXCEEDS_MAXIMUM",
        ),
        (
            {"argv": ["pwd"], "max_output_bytes": -1},
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_OUTPUT_CAP",
        ),
    ],
)
def test_exec_rejects_bad_input(
    stubs: Stubs,
    shared_session: session_pb2.Session,
    fields: dict[str, object],
    code: grpc.StatusCode,
    reason: str,
) -> None:
    request = P.ExecRequest(session_id=shared_session.session_id, **fields)  # type: ignore[arg-type]
    expect_error(lambda: stubs.processes.Exec(request), code, reason)
    run_request = P.RunRequest(session_id=shared_session.session_id, **fields)  # type: ignore[arg-type]
    expect_error(lambda: stubs.processes.Run(run_request), code, reason)


def test_cwd_symlink_out_of_workspace_is_refused(
    stubs: Stubs, shared_session: session_pb2.Session
) -> None:
    sid = shared_session.session_id
    run(stubs, sid, "ln", "-sfn", "/etc", "etc-link")
    r = run(stubs, sid, "pwd", cwd="etc-link")
    assert r.exit_code == 126 and r.stdout == b""
    assert b"ESCAPE" in r.stderr


def test_allowlist(stubs: Stubs, new_session: SessionFactory) -> None:
    denied_all = new_session(shell=common_pb2.ShellPolicy()).session_id
    err = expect_error(
        lambda: run(stubs, denied_all, "echo", "hi"),
        grpc.StatusCode.PERMISSION_DENIED,
        "COMMAND_NOT_ALLOWED",
    )
    assert "echo" in err.details()  # type: ignore[attr-defined]
    some = new_session(shell=common_pb2.ShellPolicy(allow=["echo"])).session_id
    assert run(stubs, some, "echo", "ok").stdout == b"ok\n"
    assert run(stubs, some, "/bin/echo", "ok").stdout == b"ok\n"
    expect_error(
        lambda: run(stubs, some, "sh", "-c", "echo no"),
        grpc.StatusCode.PERMISSION_DENIED,
        "COMMAND_NOT_ALLOWED",
    )
    expect_error(
        lambda: list(stubs.processes.Exec(P.ExecRequest(session_id=some, argv=["cat"]))),
        grpc.StatusCode.PERMISSION_DENIED,
        "COMMAND_NOT_ALLOWED",
    )


def test_command_that_ignores_its_stdin_still_ends(
    stubs: Stubs, shared_session: session_pb2.Session
) -> None:
    # The engine holds an exec's output open until its stdin is delivered: unread input
    # must not turn a finished command into a timed-out one.
    for argv in (["true"], ["head", "-c", "3"]):
        r = run(stubs, shared_session.session_id, *argv, stdin=b"x" * (1024 * 1024))
        assert not r.timed_out and r.exit_code == 0, (argv, r)
        assert r.duration.ToNanoseconds() < 5 * 10**9
