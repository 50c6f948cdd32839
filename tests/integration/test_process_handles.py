"""One handle for every process against the real engine: the process id that Exec,
Run and Interact report works with GetProcess, AttachProcess and SignalProcess; a background
process takes more stdin (SendProcessInput, CloseProcessStdin); `output_buffer_bytes` is the
ring and `max_output_bytes` then the cap; Run's `output_encoding`. The old shapes still answer
as before (ListProcesses lists only background processes, max_output_bytes alone is the ring)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import grpc
from conftest import ServerProcess, SessionFactory, Stubs, expect_error, run, wait_until
from google.protobuf import duration_pb2
from sandboxd.v1 import process_pb2
from sandboxd_client import SandboxClient

P = process_pb2
X = process_pb2


def get(stubs: Stubs, sid: str, pid: str) -> P.Process:
    req = X.GetProcessRequest(session_id=sid, process_id=pid)
    return stubs.processes.GetProcess(req, timeout=30).process  # type: ignore[no-any-return]


def start(stubs: Stubs, sid: str, *argv: str, **fields: object) -> P.Process:
    fields.setdefault("timeout", duration_pb2.Duration(seconds=60))
    request = P.StartProcessRequest(session_id=sid, argv=list(argv), **fields)  # type: ignore[arg-type]
    return stubs.processes.StartProcess(request, timeout=60).process  # type: ignore[no-any-return]


def attach(stubs: Stubs, sid: str, pid: str) -> list[P.AttachProcessResponse]:
    req = P.AttachProcessRequest(session_id=sid, process_id=pid)
    return list(stubs.processes.AttachProcess(req, timeout=60))


def stdout_of(events: list[P.AttachProcessResponse]) -> bytes:
    return b"".join(
        e.output.data
        for e in events
        if e.HasField("output") and e.output.stream == P.OUTPUT_STREAM_STDOUT
    )


def signal(stubs: Stubs, sid: str, pid: str, name: str) -> None:
    stubs.processes.SignalProcess(
        P.SignalProcessRequest(session_id=sid, process_id=pid, signal=name), timeout=30
    )


def test_an_exec_process_id_is_a_handle_for_get_attach_and_signal(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    script = "echo ready; trap 'echo term; exit 5' TERM; while :; do sleep 0.1; done"
    call = stubs.processes.Exec(
        P.ExecRequest(session_id=sid, argv=["sh", "-c", script]), timeout=60
    )
    events: Iterator[P.ExecResponse] = iter(call)
    first = next(events)
    pid = first.started.process_id
    assert pid
    assert next(events).output.data == b"ready\n"
    running = get(stubs, sid, pid)
    assert running.state == P.PROCESS_STATE_RUNNING
    assert running.origin == X.PROCESS_ORIGIN_EXEC
    assert list(running.argv) == ["sh", "-c", script] and running.stdout_bytes == 6
    # A second reader attaches while it runs, from offset 0.
    seen: queue.Queue[list[P.AttachProcessResponse]] = queue.Queue()
    reader = threading.Thread(target=lambda: seen.put(attach(stubs, sid, pid)), daemon=True)
    reader.start()
    time.sleep(0.5)
    signal(stubs, sid, pid, "SIGTERM")
    rest = list(events)
    assert rest[-1].exited.exit_code == 5
    out = [e.output.data for e in rest if e.output.stream == P.OUTPUT_STREAM_STDOUT]
    assert b"".join(out) == b"term\n"
    second = seen.get(timeout=30)
    assert stdout_of(second) == b"ready\nterm\n" and second[-1].exited.exit_code == 5
    done = get(stubs, sid, pid)
    assert done.state == P.PROCESS_STATE_EXITED and done.exited.exit_code == 5
    # ListProcesses lists background processes only, as before.
    listed = stubs.processes.ListProcesses(P.ListProcessesRequest(session_id=sid)).processes
    assert pid not in [p.process_id for p in listed]
    expect_error(
        lambda: signal(stubs, sid, pid, "SIGTERM"),
        grpc.StatusCode.FAILED_PRECONDITION,
        "PROCESS_EXITED",
    )


def test_a_run_process_id_is_kept_with_its_exit(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    resp = run(stubs, sid, "sh", "-c", "echo out; exit 3")
    proc = get(stubs, sid, resp.process_id)
    assert proc.origin == X.PROCESS_ORIGIN_RUN and proc.state == P.PROCESS_STATE_EXITED
    assert proc.exited.exit_code == 3 and proc.stdout_bytes == 4
    assert stdout_of(attach(stubs, sid, resp.process_id)) == b"out\n"


def test_an_interact_process_id_takes_signals_from_another_call(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    requests: queue.Queue[P.InteractRequest | None] = queue.Queue()
    requests.put(
        P.InteractRequest(
            start=P.InteractStart(
                request=P.ExecRequest(session_id=sid, argv=["sh", "-c", "echo go; sleep 600"])
            )
        )
    )
    call = stubs.processes.Interact(iter(requests.get, None), timeout=60)
    events = iter(call)
    pid = next(events).started.process_id
    assert next(events).output.data == b"go\n"
    assert get(stubs, sid, pid).origin == X.PROCESS_ORIGIN_INTERACT
    signal(stubs, sid, pid, "SIGKILL")
    rest = list(events)
    assert rest[-1].exited.signal == "SIGKILL"
    requests.put(None)


def test_send_input_and_close_stdin_of_a_background_process(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    # It outlives its stdin by a moment, so STDIN_CLOSED is not raced by its exit (the agent
    # starts and ends commands in a few ms).
    proc = start(stubs, sid, "sh", "-c", "cat; sleep 2", stdin=b"first\n", keep_stdin_open=True)
    assert proc.stdin_open and proc.origin == X.PROCESS_ORIGIN_START_PROCESS
    send = X.SendProcessInputRequest(session_id=sid, process_id=proc.process_id, data=b"more\n")
    stubs.processes.SendProcessInput(send, timeout=30)
    assert wait_until(lambda: get(stubs, sid, proc.process_id).stdout_bytes == 11)
    close = X.CloseProcessStdinRequest(session_id=sid, process_id=proc.process_id)
    stubs.processes.CloseProcessStdin(close, timeout=30)
    assert not get(stubs, sid, proc.process_id).stdin_open
    expect_error(
        lambda: stubs.processes.SendProcessInput(send, timeout=30),
        grpc.StatusCode.FAILED_PRECONDITION,
        "STDIN_CLOSED",
    )
    stubs.processes.CloseProcessStdin(close, timeout=30)  # again: a no-op while it runs
    events = attach(stubs, sid, proc.process_id)
    assert stdout_of(events) == b"first\nmore\n" and events[-1].exited.exit_code == 0
    expect_error(
        lambda: stubs.processes.SendProcessInput(send, timeout=30),
        grpc.StatusCode.FAILED_PRECONDITION,
        "PROCESS_EXITED",
    )


def test_send_input_needs_keep_stdin_open_and_a_known_process(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    proc = start(stubs, sid, "sleep", "60")
    assert not proc.stdin_open
    expect_error(
        lambda: stubs.processes.SendProcessInput(
            X.SendProcessInputRequest(session_id=sid, process_id=proc.process_id, data=b"x")
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "STDIN_CLOSED",
    )
    for call in (
        lambda: stubs.processes.SendProcessInput(
            X.SendProcessInputRequest(session_id=sid, process_id="nope", data=b"x")
        ),
        lambda: stubs.processes.CloseProcessStdin(
            X.CloseProcessStdinRequest(session_id=sid, process_id="nope")
        ),
        lambda: get(stubs, sid, "nope"),
    ):
        expect_error(call, grpc.StatusCode.NOT_FOUND, "PROCESS_NOT_FOUND")
    expect_error(
        lambda: get(stubs, "no-such-session", "nope"),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    )
    signal(stubs, sid, proc.process_id, "SIGKILL")


def test_output_buffer_bytes_is_the_ring_and_max_output_bytes_then_the_cap(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    script = "i=0; while [ $i -lt 400 ]; do echo 0123456789abcdefghij; i=$((i+1)); done; sleep 60"
    proc = start(stubs, sid, "sh", "-c", script, output_buffer_bytes=1024, max_output_bytes=4096)
    # Attach once it has ended (cut at the cap), so the reader is surely behind the ring.
    assert wait_until(lambda: get(stubs, sid, proc.process_id).state == P.PROCESS_STATE_EXITED)
    events = attach(stubs, sid, proc.process_id)
    exited = events[-1].exited
    assert exited.truncated and exited.signal == "SIGKILL"
    done = get(stubs, sid, proc.process_id)
    assert done.stdout_bytes == 4096 and done.stdout_first_offset == 4096 - 1024
    assert any(e.HasField("gap") for e in events)
    # The old shape: max_output_bytes alone is the ring, and output is never cut.
    old = start(stubs, sid, "sh", "-c", script.replace("sleep 60", "true"), max_output_bytes=1024)
    old_events = attach(stubs, sid, old.process_id)
    assert not old_events[-1].exited.truncated and old_events[-1].exited.exit_code == 0
    assert get(stubs, sid, old.process_id).stdout_bytes == 400 * 21
    expect_error(
        lambda: start(stubs, sid, "true", output_buffer_bytes=-1),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_OUTPUT_CAP",
    )


def test_run_output_encoding_utf8_lossy(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    script = "printf 'h\\303\\251llo \\377\\n'; printf 'warn\\n' >&2"
    plain = run(stubs, sid, "sh", "-c", script)
    assert plain.stdout == b"h\xc3\xa9llo \xff\n" and plain.stdout_text == ""
    text = run(stubs, sid, "sh", "-c", script, output_encoding=X.OUTPUT_ENCODING_UTF8_LOSSY)
    assert text.stdout == plain.stdout
    assert text.stdout_text == "héllo \ufffd\n" and text.stderr_text == "warn\n"
    expect_error(
        lambda: run(stubs, sid, "true", output_encoding=99),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )


def test_signals_as_enums_beside_the_strings(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    proc = start(stubs, sid, "sh", "-c", "echo ready; exec sleep 60")
    # Signalled once it runs (a signal sent before its supervisor is up finds nothing).
    assert wait_until(lambda: get(stubs, sid, proc.process_id).stdout_bytes > 0)
    stubs.processes.SignalProcess(
        P.SignalProcessRequest(
            session_id=sid, process_id=proc.process_id, signal_value=X.SIGNAL_SIGTERM
        )
    )
    events = attach(stubs, sid, proc.process_id)
    exited = events[-1].exited
    assert exited.signal == "SIGTERM" and exited.signal_value == X.SIGNAL_SIGTERM
    other = start(stubs, sid, "sh", "-c", "echo ready; exec sleep 60")
    assert wait_until(lambda: get(stubs, sid, other.process_id).stdout_bytes > 0)
    expect_error(
        lambda: stubs.processes.SignalProcess(
            P.SignalProcessRequest(session_id=sid, process_id=other.process_id, signal_value=77)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_SIGNAL",
    )
    # The string still works, and an exit by itself has no signal.
    signal(stubs, sid, other.process_id, "SIGKILL")
    assert attach(stubs, sid, other.process_id)[-1].exited.signal_value == X.SIGNAL_SIGKILL
    assert run(stubs, sid, "true").signal == ""


async def test_the_python_client_process_handles(server: ServerProcess) -> None:
    async with SandboxClient(server.address) as client:
        session = await client.create_session(allow_all=True)
        async with session:
            result = await session.run(["sh", "-c", "printf 'caf\\303\\251'"], text=True)
            assert result.stdout_text == "café"
            got = await session.get_process(result.process_id)
            assert got.origin == "RUN" and got.state == "EXITED"
            proc = await session.start_process(
                ["cat"], stdin=b"1", keep_stdin_open=True, output_buffer_bytes=4096
            )
            assert proc.stdin_open
            await session.send_input(proc.process_id, b"2")
            await session.close_stdin(proc.process_id)
            out = b"".join(
                [e.data async for e in session.attach(proc.process_id) if hasattr(e, "data")]
            )
            assert out == b"12"
            again = await session.start_process(["true"], request_id="retry-me")
            same = await session.start_process(["true"], request_id="retry-me")
            assert again.process_id == same.process_id
            assert [p.process_id async for p in session.processes(page_size=1)] == [
                proc.process_id,
                again.process_id,
            ]
