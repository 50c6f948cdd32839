"""ProcessService.Interact against the real engine: stdin, half-close, signals, PTY, bad input."""

from __future__ import annotations

import io
import queue
import secrets
import tarfile
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from conftest import (
    ServerProcess,
    SessionFactory,
    Stubs,
    error_info,
    make_stubs,
    remove_owned_containers,
    run,
    start_server,
    wait_until,
)
from google.protobuf import duration_pb2
from sandboxd.v1 import common_pb2, process_pb2, session_pb2

P = process_pb2


class Interaction:
    """One Interact call driven from a test: requests go in through a queue."""

    def __init__(self, stubs: Stubs, first: P.InteractRequest | None, timeout: float = 30) -> None:
        self._requests: queue.Queue[P.InteractRequest | None] = queue.Queue()
        if first is not None:
            self._requests.put(first)
        self.call = stubs.processes.Interact(iter(self._requests.get, None), timeout=timeout)
        self.events: list[P.InteractResponse] = []

    def send(self, **fields: object) -> None:
        self._requests.put(P.InteractRequest(**fields))  # type: ignore[arg-type]

    def stdin(self, data: bytes) -> None:
        self.send(stdin=P.InteractStdin(data=data))

    def end_requests(self) -> None:
        self._requests.put(None)

    def next(self) -> P.InteractResponse:
        event: P.InteractResponse = next(self.call)
        self.events.append(event)
        return event

    def stdout(self) -> bytes:
        return b"".join(e.output.data for e in self.events if e.HasField("output"))

    def read_until(self, predicate: Callable[[P.InteractResponse], bool]) -> P.InteractResponse:
        while True:
            event = self.next()
            if predicate(event):
                return event

    def output_contains(self, needle: bytes) -> None:
        self.read_until(lambda e: needle in self.stdout())

    def until_exit(self) -> P.ProcessExited:
        return self.read_until(lambda e: e.HasField("exited")).exited


def start(session_id: str, *argv: str, pty: tuple[int, int] | None = None, **fields: object):  # type: ignore[no-untyped-def]
    request = P.ExecRequest(session_id=session_id, argv=list(argv), **fields)  # type: ignore[arg-type]
    size = P.PtySize(rows=pty[0], cols=pty[1]) if pty else None
    return P.InteractRequest(start=P.InteractStart(request=request, pty=size))


def _alive(stubs: Stubs, sid: str, marker: str) -> bool:
    ps = run(stubs, sid, "ps", "-o", "pid,args").stdout.decode()
    return any(marker in line and "ps -o" not in line for line in ps.splitlines())


def test_stdin_round_trip_and_half_close(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    it = Interaction(stubs, start(shared_session.session_id, "cat"))
    assert it.next().started.process_id
    it.stdin(b"hello\n")
    it.output_contains(b"hello\n")
    it.stdin(b"world\n")
    it.output_contains(b"world\n")
    it.send(close_stdin=P.InteractCloseStdin())
    exited = it.until_exit()
    assert exited.exit_code == 0 and it.stdout() == b"hello\nworld\n"
    it.end_requests()


def test_tar_sees_eof_after_close_stdin(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"x" * 300_000
        info = tarfile.TarInfo("untarred/big.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    archive = buf.getvalue()
    sid = shared_session.session_id
    it = Interaction(stubs, start(sid, "tar", "-x", "-f", "-"))
    for i in range(0, len(archive), 64 * 1024):
        it.stdin(archive[i : i + 64 * 1024])
    it.send(close_stdin=P.InteractCloseStdin())
    assert it.until_exit().exit_code == 0
    it.end_requests()
    assert run(stubs, sid, "wc", "-c", "untarred/big.bin").stdout.split()[0] == b"300000"


def test_initial_stdin_is_written_and_stdin_stays_open(
    stubs: Stubs, shared_session: session_pb2.Session
) -> None:
    it = Interaction(stubs, start(shared_session.session_id, "cat", stdin=b"first "))
    it.output_contains(b"first ")
    it.stdin(b"second")
    it.output_contains(b"first second")
    it.send(close_stdin=P.InteractCloseStdin())
    assert it.until_exit().exit_code == 0
    it.end_requests()


def test_signal_reaches_the_process_group(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    script = (
        "sleep 601 & trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.1; done"
    )
    it = Interaction(stubs, start(sid, "sh", "-c", script))
    it.output_contains(b"ready")
    assert _alive(stubs, sid, "sleep 601")
    it.send(signal=P.InteractSignal(signal="SIGTERM"))
    exited = it.until_exit()
    assert exited.exit_code == 3 and b"got-term" in it.stdout()
    it.end_requests()
    assert not _alive(stubs, sid, "sleep 601")


def test_pty_echo_merge_and_ctrl_c(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    it = Interaction(stubs, start(shared_session.session_id, "sh", pty=(24, 80)))
    # Markers are split by quotes so the terminal's echo of the typed line does not match.
    it.stdin(b"tty; echo $((6*7)); echo to-std''err >&2\n")
    it.output_contains(b"to-stderr\r\n")
    out = it.stdout()
    assert b"/dev/pts/" in out and b"42" in out
    # Under a terminal stderr arrives on the stdout stream.
    assert all(e.output.stream == P.OUTPUT_STREAM_STDOUT for e in it.events if e.HasField("output"))
    it.stdin(b"sleep 30; echo not-inter''rupted\n")
    time.sleep(0.3)
    it.stdin(b"\x03")  # ^C: the terminal sends SIGINT to the foreground group
    it.stdin(b"echo after-''ctrl-c\n")
    it.output_contains(b"after-ctrl-c\r\n")
    it.stdin(b"exit 5\n")
    assert it.until_exit().exit_code == 5
    assert b"not-interrupted" not in it.stdout()
    it.end_requests()


def test_pty_size_and_resize(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    it = Interaction(
        stubs,
        start(shared_session.session_id, "sh", "-c", "stty size; read x; stty size", pty=(30, 100)),
    )
    it.output_contains(b"30 100")
    it.send(resize=P.InteractResize(rows=40, cols=120))
    time.sleep(0.2)
    it.stdin(b"\n")
    it.output_contains(b"40 120")
    assert it.until_exit().exit_code == 0
    it.end_requests()


@pytest.mark.serial  # a wall-clock bound of a few seconds: run alone
def test_cancel_kills_the_interactive_command(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    it = Interaction(stubs, start(sid, "sh", "-c", "sleep 602 & echo ready; cat"))
    it.output_contains(b"ready")
    assert _alive(stubs, sid, "sleep 602")
    cancelled = time.monotonic()
    it.call.cancel()
    assert wait_until(lambda: not _alive(stubs, sid, "sleep 602"), timeout=5, interval=0.05)
    assert time.monotonic() - cancelled < 1.5


def _expect_interact_error(
    stubs: Stubs,
    messages: list[P.InteractRequest],
    code: grpc.StatusCode,
    reason: str,
    before: Callable[[Interaction], None] | None = None,
) -> Interaction:
    it = Interaction(stubs, None)
    for m in messages:
        it._requests.put(m)
    with pytest.raises(grpc.RpcError) as excinfo:
        if before is not None:
            before(it)
        while True:
            it.next()
    err = excinfo.value
    assert err.code() == code, err.details()  # type: ignore[attr-defined]
    info = error_info(err)
    assert (info.reason, info.domain) == (reason, "sandboxd"), err.details()  # type: ignore[attr-defined]
    it.end_requests()
    return it


def test_first_message_must_be_start(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    bad = grpc.StatusCode.INVALID_ARGUMENT
    stdin_first = P.InteractRequest(stdin=P.InteractStdin(data=b"x"))
    _expect_interact_error(stubs, [stdin_first], bad, "INVALID_FIRST_MESSAGE")
    _expect_interact_error(stubs, [P.InteractRequest()], bad, "INVALID_FIRST_MESSAGE")
    # A call that sends nothing at all and ends its requests.
    it = Interaction(stubs, None)
    it.end_requests()
    with pytest.raises(grpc.RpcError) as excinfo:
        it.next()
    assert excinfo.value.code() == bad  # type: ignore[attr-defined]
    assert error_info(excinfo.value).reason == "INVALID_FIRST_MESSAGE"


@pytest.mark.parametrize(
    ("pty", "follow_up", "code", "reason"),
    [
        (
            None,
            {"signal": P.InteractSignal(signal="SIGBOGUS")},
            "INVALID_ARGUMENT",
            "INVALID_SIGNAL",
        ),
        (None, {"signal": P.InteractSignal(signal="")}, "INVALID_ARGUMENT", "INVALID_SIGNAL"),
        (None, {"signal": P.InteractSignal(signal="9")}, "INVALID_ARGUMENT", "INVALID_SIGNAL"),
        (
            (24, 80),
            {"resize": P.InteractResize(rows=0, cols=80)},
            "INVALID_ARGUMENT",
            "INVALID_PTY_SIZE",
        ),
        (
            (24, 80),
            {"resize": P.InteractResize(rows=24, cols=0)},
            "INVALID_ARGUMENT",
            "INVALID_PTY_SIZE",
        ),
        (
            (24, 80),
            {"resize": P.InteractResize(rows=1001, cols=80)},
            "INVALID_ARGUMENT",
            "INVALID_PTY_SIZE",
        ),
        (
            (24, 80),
            {"resize": P.InteractResize(rows=24, cols=1001)},
            "INVALID_ARGUMENT",
            "INVALID_PTY_SIZE",
        ),
        (
            None,
            {"resize": P.InteractResize(rows=24, cols=80)},
            "FAILED_PRECONDITION",
            "NOT_A_TERMINAL",
        ),
        (None, {"start": P.InteractStart()}, "INVALID_ARGUMENT", "INVALID_INTERACT_MESSAGE"),
        (None, {}, "INVALID_ARGUMENT", "INVALID_INTERACT_MESSAGE"),
    ],
)
def test_bad_control_messages(
    stubs: Stubs,
    new_session: SessionFactory,
    pty: tuple[int, int] | None,
    follow_up: dict[str, object],
    code: str,
    reason: str,
) -> None:
    sid = new_session().session_id
    first = start(sid, "sh", "-c", "echo ready; sleep 603", pty=pty)
    _expect_interact_error(
        stubs,
        [first, P.InteractRequest(**follow_up)],
        getattr(grpc.StatusCode, code),
        reason,  # type: ignore[arg-type]
    )
    # The failed interaction's command does not outlive it.
    assert wait_until(lambda: not _alive(stubs, sid, "sleep 603"), timeout=3)


@pytest.mark.parametrize(
    "size", [(0, 80), (24, 0), (1001, 80), (24, 1001), (0, 0)], ids=lambda s: f"{s[0]}x{s[1]}"
)
def test_bad_pty_size_at_start(
    stubs: Stubs, shared_session: session_pb2.Session, size: tuple[int, int]
) -> None:
    request = P.ExecRequest(session_id=shared_session.session_id, argv=["true"])
    first = P.InteractRequest(
        start=P.InteractStart(request=request, pty=P.PtySize(rows=size[0], cols=size[1]))
    )
    _expect_interact_error(stubs, [first], grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PTY_SIZE")


def test_stdin_after_close_is_failed_precondition(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    messages = [
        start(sid, "sh", "-c", "sleep 604"),
        P.InteractRequest(close_stdin=P.InteractCloseStdin()),
        P.InteractRequest(stdin=P.InteractStdin(data=b"late")),
    ]
    _expect_interact_error(stubs, messages, grpc.StatusCode.FAILED_PRECONDITION, "STDIN_CLOSED")
    assert wait_until(lambda: not _alive(stubs, sid, "sleep 604"), timeout=3)


def test_start_is_checked_like_exec(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    sid = shared_session.session_id
    _expect_interact_error(
        stubs, [start(sid, "../bin/sh")], grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGV"
    )
    _expect_interact_error(
        stubs,
        [start("no-such-session-" + secrets.token_hex(3), "true")],
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    )


# ----- keepalive (a server of its own with a short interval) ---------------------------------


@pytest.fixture(scope="module")
def fast_keepalive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stubs]:
    owner = "testka" + secrets.token_hex(3)
    srv: ServerProcess = start_server(
        tmp_path_factory.mktemp("ka"), owner, "--keepalive-interval-s", "200ms"
    )
    stubs = make_stubs(srv.address)
    try:
        yield stubs
    finally:
        stubs.channel.close()
        srv.stop()
        remove_owned_containers(owner)


def test_keepalive_on_quiet_streams(fast_keepalive: Stubs) -> None:
    stubs = fast_keepalive
    sid = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
    ).session.session_id
    try:
        it = Interaction(stubs, start(sid, "sh", "-c", "sleep 1; echo done"))
        it.until_exit()
        it.end_requests()
        kinds = [e.WhichOneof("event") for e in it.events]
        assert kinds[0] == "started" and kinds[-1] == "exited"
        assert kinds.count("keepalive") >= 2, kinds
        events = list(
            stubs.processes.Exec(
                P.ExecRequest(
                    session_id=sid,
                    argv=["sleep", "1"],
                    timeout=duration_pb2.Duration(seconds=5),
                )
            )
        )
        assert [e.WhichOneof("event") for e in events].count("keepalive") >= 2
    finally:
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


# ----- a terminal lasts as long as it is used ------------------------------------------------


def _short_session(new_session: SessionFactory) -> str:
    """A session whose commands may run 1 s and print 4 KiB: an interactive one outlasts both."""
    limits = common_pb2.ResourceLimits(
        command_timeout=duration_pb2.Duration(seconds=1), output_bytes=4096
    )
    return str(new_session(limits=limits).session_id)


def test_an_interactive_command_has_no_deadline_and_no_output_cap(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    """`sandboxctl shell` died at the session's command timeout (exit 137, no message)."""
    sid = _short_session(new_session)
    script = "sleep 2.5; head -c 100000 /dev/zero | tr '\\0' x; echo; echo done"
    it = Interaction(stubs, start(sid, "sh", "-c", script))
    exited = it.until_exit()
    assert (exited.exit_code, exited.signal, exited.timed_out) == (0, "", False)
    assert not exited.truncated
    assert it.stdout().count(b"x") == 100000 and it.stdout().endswith(b"done\n")
    # Exec and Run in the same session keep its timeout.
    assert run(stubs, sid, "sleep", "3").timed_out


def test_an_interactive_timeout_asked_for_still_holds(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    it = Interaction(stubs, start(sid, "sleep", "30", timeout=duration_pb2.Duration(seconds=1)))
    assert it.until_exit().timed_out


def test_a_quiet_terminal_ends_at_its_idle_timeout_and_a_used_one_does_not(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    idle = duration_pb2.Duration(seconds=1)
    used = Interaction(
        stubs,
        P.InteractRequest(
            start=P.InteractStart(
                request=P.ExecRequest(session_id=sid, argv=["cat"]), idle_timeout=idle
            )
        ),
    )
    for n in range(6):  # typing every 0.4 s for 2.4 s: past the idle timeout, still open
        used.stdin(b"line %d\n" % n)
        time.sleep(0.4)
    used.output_contains(b"line 5\n")
    used.send(close_stdin=P.InteractCloseStdin())
    assert used.until_exit().exit_code == 0
    used.end_requests()

    quiet = P.InteractRequest(
        start=P.InteractStart(
            request=P.ExecRequest(session_id=sid, argv=["sh", "-c", "echo ready; exec sleep 603"]),
            idle_timeout=idle,
        )
    )
    began = time.monotonic()
    it = _expect_interact_error(stubs, [quiet], grpc.StatusCode.DEADLINE_EXCEEDED, "INTERACT_IDLE")
    assert time.monotonic() - began < 15
    assert b"ready" in it.stdout()
    assert wait_until(lambda: not _alive(stubs, sid, "sleep 603"), timeout=5)


def test_an_idle_timeout_past_the_longest_lease_is_refused(
    stubs: Stubs, shared_session: session_pb2.Session
) -> None:
    too_long = P.InteractRequest(
        start=P.InteractStart(
            request=P.ExecRequest(session_id=shared_session.session_id, argv=["true"]),
            idle_timeout=duration_pb2.Duration(seconds=10**9),
        )
    )
    _expect_interact_error(
        stubs, [too_long], grpc.StatusCode.INVALID_ARGUMENT, "LIMIT_EXCEEDS_MAXIMUM"
    )
