"""FilesystemService.WatchDir against the real engine and a real server: the in-sandbox
watcher's events through Run, WriteFile and Move; recursion into new directories; overflow
toward a slow client; confinement; many watches; nothing left running after a cancel or a
delete."""

from __future__ import annotations

import contextlib
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import grpc
import pytest
from conftest import (
    ServerProcess,
    SessionFactory,
    Stubs,
    error_info,
    make_stubs,
    own_server,
    run,
    wait_until,
)
from sandboxd.v1 import common_pb2, filesystem_pb2, session_pb2, watch_pb2

F = filesystem_pb2
K = watch_pb2.FileEventKind


Event = filesystem_pb2.FileEvent


class Watch:
    """One WatchDir call, read by a thread into a queue (the test's thread never blocks)."""

    def __init__(self, stubs: Stubs, sid: str, path: str = "", recursive: bool = False) -> None:
        self.sid = sid
        self.call = stubs.files.WatchDir(
            watch_pb2.WatchDirRequest(session_id=sid, path=path, recursive=recursive)
        )
        self.events: queue.Queue[Event | BaseException | None] = queue.Queue()
        self.ended: BaseException | None = None

    def start(self) -> Watch:
        """Wait for the watch to be in place (the stream's headers), then read in the back."""
        assert dict(self.call.initial_metadata()).get("sandboxd-watch") == "ready"
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        try:
            for resp in self.call:
                self.events.put(resp.event)
            self.events.put(None)
        except grpc.RpcError as err:
            self.events.put(err)

    def collect(
        self, quiet: float = 1.0, limit: float = 20.0, until: Callable[[Event], bool] | None = None
    ) -> list[Event]:
        """The events that come: until one matches `until` (pauses do not end the wait then),
        else until a pause of `quiet` seconds; at most `limit` seconds, or to the stream's end
        (`ended`: the RpcError, or StopIteration for a status OK)."""
        got: list[Event] = []
        end = time.monotonic() + limit
        while (left := end - time.monotonic()) > 0:
            try:
                item = self.events.get(timeout=min(quiet if until is None else 0.2, left))
            except queue.Empty:
                if until is None:
                    break
                continue
            if item is None or isinstance(item, BaseException):
                self.ended = item if isinstance(item, BaseException) else StopIteration()
                break
            got.append(item)
            if until is not None and until(item):
                break
        return got

    def assert_ended_with(self, code: grpc.StatusCode, reason: str, quiet: float) -> None:
        """The stream ends with that status, no event before it, within `quiet` seconds."""
        started = time.monotonic()
        assert self.collect(quiet=quiet) == []
        assert time.monotonic() - started < quiet
        assert isinstance(self.ended, grpc.RpcError), self.ended
        assert self.ended.code() == code
        assert error_info(self.ended).reason == reason


def brief(events: list[filesystem_pb2.FileEvent]) -> list[tuple[str, ...]]:
    return [
        (
            K.Name(e.kind).removeprefix("FILE_EVENT_KIND_"),
            e.path,
            *([e.old_path] * bool(e.old_path)),
        )
        for e in events
    ]


@pytest.fixture
def watches() -> Iterator[list[Watch]]:
    made: list[Watch] = []
    yield made
    for w in made:
        w.call.cancel()


class Watcher(Protocol):
    def __call__(self, sid: str = "", path: str = "", recursive: bool = False) -> Watch:
        """A watch in place on `sid` (a new session when empty), cancelled after the test."""
        ...


@pytest.fixture
def watch(stubs: Stubs, new_session: SessionFactory, watches: list[Watch]) -> Watcher:
    def start(sid: str = "", path: str = "", recursive: bool = False) -> Watch:
        w = Watch(stubs, sid or new_session().session_id, path, recursive)
        watches.append(w)
        return w.start()

    return start


def test_sequence_through_run(stubs: Stubs, watch: Watcher) -> None:
    w = watch()
    run(stubs, w.sid, "sh", "-c", "echo a > f; echo b >> f; mv f g; chmod 600 g; rm g")
    events = w.collect()
    kinds = brief(events)
    assert kinds[0] == ("CREATED", "f")
    assert kinds[-3:] == [("RENAMED", "g", "f"), ("ATTRIBUTES", "g"), ("REMOVED", "g")]
    assert set(kinds[1:-3]) == {("MODIFIED", "f")}  # one or two: coalesced within the window
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    # A type is looked up when the event is read: a file already gone may have none.
    assert {e.type for e in events} <= {F.FILE_TYPE_FILE, F.FILE_TYPE_UNSPECIFIED}


def test_sequence_through_write_file_and_move(stubs: Stubs, watch: Watcher) -> None:
    w = watch(path="/workspace")
    sid = w.sid
    stubs.files.WriteFile(F.WriteFileRequest(session_id=sid, path="a.txt", content=b"1"))
    stubs.files.WriteFile(F.WriteFileRequest(session_id=sid, path="a.txt", content=b"22"))
    stubs.files.Move(
        filesystem_pb2.MoveRequest(session_id=sid, source_path="a.txt", destination_path="b")
    )
    stubs.files.Remove(F.RemoveRequest(session_id=sid, path="b"))
    events = w.collect()
    assert brief(events) == [
        ("CREATED", "a.txt"),
        ("MODIFIED", "a.txt"),
        ("RENAMED", "b", "a.txt"),
        ("REMOVED", "b"),
    ]
    assert [e.sequence for e in events] == [1, 2, 3, 4]


def test_recursive_sees_directories_made_after_the_watch(stubs: Stubs, watch: Watcher) -> None:
    flat = watch()
    sid = flat.sid
    deep = watch(sid, recursive=True)
    run(stubs, sid, "sh", "-c", "mkdir -p a/b/c && echo x > a/b/c/made.txt")
    stubs.files.WriteFile(
        F.WriteFileRequest(session_id=sid, path="a/b/c/api.txt", content=b"y", make_parents=True)
    )
    got = {(k[0], k[1]) for k in brief(deep.collect(until=lambda e: e.path == "a/b/c/api.txt"))}
    for want in ("a", "a/b", "a/b/c", "a/b/c/made.txt", "a/b/c/api.txt"):
        assert ("CREATED", want) in got, (want, got)
    assert brief(flat.collect()) == [("CREATED", "a")]


def test_modified_is_coalesced_per_file(
    stubs: Stubs, new_session: SessionFactory, watch: Watcher
) -> None:
    sid = new_session().session_id
    stubs.files.WriteFile(F.WriteFileRequest(session_id=sid, path="log", content=b""))
    w = watch(sid)
    run(stubs, sid, "sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo $i >> log; done")
    kinds = brief(w.collect())
    assert set(kinds) == {("MODIFIED", "log")}
    assert len(kinds) <= 3, kinds


@pytest.mark.parametrize(
    ("path", "code", "reason"),
    [
        ("../etc", grpc.StatusCode.INVALID_ARGUMENT, "PATH_OUTSIDE_WORKSPACE"),
        ("/etc", grpc.StatusCode.INVALID_ARGUMENT, "PATH_OUTSIDE_WORKSPACE"),
        ("out", grpc.StatusCode.INVALID_ARGUMENT, "PATH_OUTSIDE_WORKSPACE"),
        ("out/ssl", grpc.StatusCode.INVALID_ARGUMENT, "PATH_OUTSIDE_WORKSPACE"),
        ("missing", grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND"),
        ("file", grpc.StatusCode.FAILED_PRECONDITION, "NOT_A_DIRECTORY"),
    ],
)
def test_refused_paths(
    stubs: Stubs, shared_session: session_pb2.Session, path: str, code, reason: str
) -> None:  # type: ignore[no-untyped-def]
    sid = shared_session.session_id
    run(stubs, sid, "sh", "-c", "ln -sfn /etc out; echo x > file")
    call = stubs.files.WatchDir(watch_pb2.WatchDirRequest(session_id=sid, path=path))
    with pytest.raises(grpc.RpcError) as err:
        next(iter(call))
    assert err.value.code() == code
    assert error_info(err.value).reason == reason


def test_fifty_watches_on_one_session(stubs: Stubs, watch: Watcher) -> None:
    first = watch()
    all_watches = [first, *(watch(first.sid, recursive=bool(i % 2)) for i in range(1, 50))]
    sid = first.sid
    stubs.files.WriteFile(F.WriteFileRequest(session_id=sid, path="hello", content=b"x"))
    for w in all_watches:
        assert ("CREATED", "hello") in brief(w.collect(until=lambda e: e.path == "hello"))


def _watchers(stubs: Stubs, sid: str) -> list[str]:
    out = run(stubs, sid, "ps", "-o", "pid,args").stdout.decode()
    return [line for line in out.splitlines() if " watch " in line and "sbx" in line]


def test_cancel_leaves_no_watcher_running(stubs: Stubs, watch: Watcher) -> None:
    ws = [watch()]
    sid = ws[0].sid
    ws.append(watch(sid, "", True))
    assert len(_watchers(stubs, sid)) == 2
    for w in ws:
        w.call.cancel()
    assert wait_until(lambda: not _watchers(stubs, sid), timeout=10), _watchers(stubs, sid)


def test_session_delete_ends_the_stream(stubs: Stubs, watch: Watcher) -> None:
    w = watch()
    stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=w.sid))
    w.assert_ended_with(grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND", quiet=15)


@pytest.fixture(scope="module")
def tight_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    owner = "test" + secrets.token_hex(4)
    with own_server(
        Path(tmp_path_factory.mktemp("data")),
        owner,
        "--watch-queue",
        "4",
        "--watch-max-per-session",
        "3",
    ) as srv:
        yield srv


@pytest.fixture
def tight(tight_server: ServerProcess) -> Iterator[tuple[Stubs, str]]:
    s = make_stubs(tight_server.address)
    sid = s.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
    ).session.session_id
    try:
        yield s, sid
    finally:
        with contextlib.suppress(grpc.RpcError):
            s.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
        s.channel.close()


def test_slow_client_gets_an_overflow_not_a_silent_loss(tight: tuple[Stubs, str]) -> None:
    s, sid = tight
    call = s.files.WatchDir(watch_pb2.WatchDirRequest(session_id=sid))
    try:
        assert dict(call.initial_metadata())["sandboxd-watch"] == "ready"
        # Nothing read meanwhile: gRPC's window fills, then the watch's queue of 4.
        script = "i=0; while [ $i -lt 6000 ]; do : > f-long-enough-name-$i; i=$((i+1)); done"
        run(s, sid, "sh", "-c", script)
        got: list[filesystem_pb2.FileEvent] = []
        for resp in call:
            got.append(resp.event)
            if resp.event.kind == K.FILE_EVENT_KIND_OVERFLOW:
                break
        assert got[-1].kind == K.FILE_EVENT_KIND_OVERFLOW, len(got)
        assert got[-1].path == ""
        assert len(got) < 6000
        assert [e.sequence for e in got] == list(range(1, len(got) + 1))
    finally:
        call.cancel()


def test_watch_limit_per_session(tight: tuple[Stubs, str]) -> None:
    s, sid = tight
    calls = [s.files.WatchDir(watch_pb2.WatchDirRequest(session_id=sid)) for _ in range(3)]
    try:
        for c in calls:
            c.initial_metadata()
        extra = s.files.WatchDir(watch_pb2.WatchDirRequest(session_id=sid))
        with pytest.raises(grpc.RpcError) as err:
            next(iter(extra))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_info(err.value).reason == "WATCH_LIMIT"
        calls.pop().cancel()
        # The slot is given back once the cancelled watch has ended.
        assert wait_until(lambda: _opens(s, sid), timeout=10)
    finally:
        for c in calls:
            c.cancel()


def _opens(s: Stubs, sid: str) -> bool:
    call = s.files.WatchDir(watch_pb2.WatchDirRequest(session_id=sid))
    try:
        return dict(call.initial_metadata()).get("sandboxd-watch") == "ready"
    finally:
        call.cancel()


def test_session_suspend_ends_the_stream(stubs: Stubs, watch: Watcher) -> None:
    w = watch()
    sid = w.sid
    stubs.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=sid))
    w.assert_ended_with(grpc.StatusCode.FAILED_PRECONDITION, "SESSION_NOT_RUNNING", quiet=20)
    # The watch did not resume the session: it stays suspended until a call needs it.
    state = stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=sid)).session.state
    assert state == session_pb2.SESSION_STATE_SUSPENDED


def test_removing_the_watched_directory_ends_the_stream_cleanly(
    stubs: Stubs, new_session: SessionFactory, watch: Watcher
) -> None:
    sid = new_session().session_id
    stubs.files.MakeDir(F.MakeDirRequest(session_id=sid, path="d/e", parents=True))
    w = watch(sid, "d", recursive=True)
    stubs.files.Remove(F.RemoveRequest(session_id=sid, path="d", recursive=True))
    events = w.collect(quiet=10)
    assert events[-1].kind == K.FILE_EVENT_KIND_REMOVED and events[-1].path == "d"
    assert isinstance(w.ended, StopIteration), w.ended  # status OK
    assert wait_until(lambda: not _watchers(stubs, sid), timeout=10)
