"""The WatchDir domain (sandboxd.dir_watch) without Docker: the queue toward a slow client
(coalescing, order, overflow, sequence numbers) and the watch's life around the in-sandbox
watcher (ready, errors, limit per session, a clean end on cancel, why a watch ended).

The engine is a scripted stand-in whose exec plays the watcher's lines as `sbx watch` prints
them (tests/unit/test_helper_watch.py runs the real helper; tests/integration/test_watch_dir.py
the whole path on the real engine)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sandboxd.commands.sandbox import AgentFirstCommands
from sandboxd.config_sections import WatchSection
from sandboxd.dir_watch import DirWatches, FileEvent, FileEventKind, WatchQueue, parse_event
from sandboxd.engine.protocol import ExecRequest
from sandboxd.errors import (
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SessionNotFound,
    Unavailable,
)
from sandboxd.helper_client import HelperClient
from sandboxd.models import FileType, Session, SessionState
from sandboxd.reasons import Reason

from tests.engine_contract import running_session

C, M, R = FileEventKind.CREATED, FileEventKind.MODIFIED, FileEventKind.REMOVED


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ev(kind: FileEventKind, path: str, old: str = "") -> FileEvent:
    return FileEvent(kind, path, old, FileType.FILE)


async def drain(q: WatchQueue) -> list[tuple[int, str, str]]:
    q.close()
    got = []
    while (e := await q.get()) is not None:
        got.append((e.sequence, e.kind.value, e.path))
    return got


# -- the queue -------------------------------------------------------------------------------


async def test_events_are_numbered_in_order() -> None:
    q = WatchQueue(limit=10, coalesce_s=0)
    for e in (ev(C, "a"), ev(R, "a"), ev(C, "b")):
        q.put(e)
    assert await drain(q) == [(1, "created", "a"), (2, "removed", "a"), (3, "created", "b")]


async def test_modified_waiting_absorbs_later_ones_of_the_same_file() -> None:
    q = WatchQueue(limit=10, coalesce_s=0)
    for e in (ev(M, "a"), ev(M, "b"), ev(M, "a"), ev(M, "a")):
        q.put(e)
    assert await drain(q) == [(1, "modified", "a"), (2, "modified", "b")]


async def test_an_event_between_ends_the_merging() -> None:
    """MODIFIED a, RENAMED a->x, MODIFIED a: the new `a` must not hide behind the first."""
    q = WatchQueue(limit=10, coalesce_s=0)
    for e in (ev(M, "a"), ev(FileEventKind.RENAMED, "x", "a"), ev(M, "a")):
        q.put(e)
    assert [k for _, k, _ in await drain(q)] == ["modified", "renamed", "modified"]


async def test_a_delivered_modified_is_not_merged_into() -> None:
    q = WatchQueue(limit=10, coalesce_s=0)
    q.put(ev(M, "a"))
    first = await q.get()
    q.put(ev(M, "a"))
    second = await q.get()
    assert first is not None and second is not None
    assert (first.sequence, second.sequence) == (1, 2)


async def test_modified_is_held_for_the_window() -> None:
    clock = Clock()
    q = WatchQueue(limit=10, coalesce_s=0.05, clock=clock)
    q.put(ev(M, "a"))
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0.01)
    assert not getter.done()  # held: more writes may come
    q.put(ev(M, "a"))  # merged meanwhile
    clock.now += 0.05
    event = await asyncio.wait_for(getter, 1)
    assert event is not None and (event.sequence, event.kind) == (1, M)
    q.close()
    assert await q.get() is None


async def test_a_full_queue_drops_for_one_overflow_in_place() -> None:
    q = WatchQueue(limit=3, coalesce_s=0)
    for i in range(10):
        q.put(ev(C, f"f{i}"))
    got = await drain(q)
    assert got == [
        (1, "created", "f0"),
        (2, "created", "f1"),
        (3, "created", "f2"),
        (4, "overflow", ""),
    ]


async def test_events_after_an_overflow_come_after_it() -> None:
    q = WatchQueue(limit=3, coalesce_s=0)
    for i in range(5):
        q.put(ev(C, f"f{i}"))
    assert (await q.get()) is not None  # room again: the overflow takes it first
    q.put(ev(C, "lost"))  # the queue is full again (f1, f2, overflow)
    assert (await q.get()) is not None
    q.put(ev(C, "late"))
    assert [(k, p) for _, k, p in await drain(q)] == [
        ("created", "f2"),
        ("overflow", ""),
        ("created", "late"),
    ]


async def test_the_watchers_own_overflows_are_one_event() -> None:
    q = WatchQueue(limit=10, coalesce_s=0)
    q.put(FileEvent(FileEventKind.OVERFLOW, ""))
    q.put(FileEvent(FileEventKind.OVERFLOW, ""))
    q.put(ev(C, "a"))
    assert [k for _, k, _ in await drain(q)] == ["overflow", "created"]


def test_parse_event_lines() -> None:
    line = b'{"kind":"renamed","path":"b","old_path":"a","type":"dir"}'
    assert parse_event(line) == FileEvent(FileEventKind.RENAMED, "b", "a", FileType.DIRECTORY)
    assert parse_event(b'{"kind":"created","path":"x"}') == FileEvent(C, "x", "", None)
    assert parse_event(b'{"kind":"ready"}') is None
    assert parse_event(b"not json") is None


# -- the watch around the watcher ------------------------------------------------------------


class Stream:
    """The watcher's exec: lines fed by the test, its stdin's end recorded."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue[tuple[int, bytes] | Exception | None] = asyncio.Queue()
        self.stdin_closed = False
        self.closed = False
        self.code = 0

    def say(self, *lines: bytes, fd: int = 1) -> None:
        for line in lines:
            self.frames.put_nowait((fd, line + b"\n" if fd == 1 else line))

    def end(self, code: int = 0) -> None:
        self.code = code
        self.frames.put_nowait(None)

    def fail(self, error: Exception) -> None:
        self.frames.put_nowait(error)

    async def read(self) -> tuple[int, bytes] | None:
        item = await self.frames.get()
        if isinstance(item, Exception):
            raise item
        return item

    def close_stdin(self) -> None:
        self.stdin_closed = True

    async def close(self) -> None:
        self.closed = True

    async def wait_exit_code(self) -> int:
        return self.code


class Engine:
    def __init__(self) -> None:
        self.streams: list[Stream] = []
        self.argv: list[list[str]] = []
        self.script: list[bytes] = [b'{"kind":"ready"}']

    @contextlib.asynccontextmanager
    async def exec(self, container_id: str, request: ExecRequest) -> AsyncIterator[Any]:
        assert request.stdin is True  # the watcher ends when its stdin does
        stream = Stream()
        stream.say(*self.script)
        self.streams.append(stream)
        self.argv.append(list(request.argv))
        yield stream


class Records:
    def __init__(self, session: Session) -> None:
        self.session: Session | None = session

    async def get(self, session_id: str) -> Session:
        if self.session is None:
            raise SessionNotFound(session_id)
        return self.session


@pytest.fixture
def setup() -> tuple[DirWatches, Engine, Records, Session]:
    engine, session = Engine(), running_session()
    records = Records(session)
    settings = WatchSection(max_per_session=2, coalesce_s=0.0, queue=16, max_directories=99)
    helper = HelperClient(AgentFirstCommands(engine, engine, None))  # type: ignore[arg-type]
    return DirWatches(helper, records, settings), engine, records, session


async def test_events_flow_after_ready_and_the_end_is_clean(setup) -> None:  # type: ignore[no-untyped-def]
    watches, engine, _, session = setup
    async with watches.watch(session, "/workspace/src", True) as events:
        assert engine.argv[0][1:] == [
            "watch",
            "src",
            "--max-watches",
            "99",
            "--queue",
            "16",
            "--recursive",
        ]
        stream = engine.streams[0]
        stream.say(b'{"kind":"created","path":"src/a","type":"file"}')
        stream.say(b'{"kind":"removed","path":"src","type":"dir"}')
        stream.end(0)
        got = [(e.sequence, e.kind, e.path, e.type) async for e in events]
    assert got == [(1, C, "src/a", FileType.FILE), (2, R, "src", FileType.DIRECTORY)]


@pytest.mark.parametrize(
    ("error", "cls", "reason"),
    [
        (b'{"error":"ENOENT","message":"x"}', NotFound, Reason.FILE_NOT_FOUND),
        (b'{"error":"ESCAPE","message":"x"}', InvalidArgument, Reason.PATH_OUTSIDE_WORKSPACE),
        (b'{"error":"ENOTDIR","message":"x"}', FailedPrecondition, Reason.NOT_A_DIRECTORY),
    ],
)
async def test_a_watcher_that_refuses_is_the_file_operations_error(  # type: ignore[no-untyped-def]
    setup, error: bytes, cls: type[Exception], reason: str
) -> None:
    watches, engine, _, session = setup
    engine.script = []
    task = asyncio.create_task(_enter(watches, session, "x"))
    await asyncio.sleep(0.01)
    engine.streams[0].say(error + b"\n", fd=2)
    engine.streams[0].end(1)
    with pytest.raises(cls) as err:
        await task
    assert err.value.reason == reason  # type: ignore[attr-defined]
    assert watches.open_count("s1") == 0


async def _enter(watches: DirWatches, session: Session, path: str) -> None:
    async with watches.watch(session, path, False):
        pass


async def test_paths_out_of_the_workspace_are_refused_before_any_exec(setup) -> None:  # type: ignore[no-untyped-def]
    watches, engine, _, session = setup
    for path in ("../etc", "/etc", "a/../../b"):
        with pytest.raises(InvalidArgument):
            await _enter(watches, session, path)
    assert engine.argv == []


async def test_limit_per_session_and_the_slot_given_back(setup) -> None:  # type: ignore[no-untyped-def]
    watches, engine, _, session = setup
    async with watches.watch(session, "", False), watches.watch(session, "", False):
        with pytest.raises(ResourceExhausted) as err:
            await _enter(watches, session, "")
        assert err.value.reason == Reason.WATCH_LIMIT
        other = dataclasses.replace(session, session_id="s2")
        await _enter(watches, other, "")  # another session has its own count
    assert watches.open_count("s1") == 0
    await _enter(watches, session, "")


async def test_leaving_closes_the_watchers_stdin_and_exec(setup) -> None:  # type: ignore[no-untyped-def]
    watches, engine, _, session = setup
    async with watches.watch(session, "", False) as events:
        engine.streams[0].say(b'{"kind":"created","path":"a"}')
        assert (await anext(aiter(events))).path == "a"
    stream = engine.streams[0]
    assert stream.stdin_closed and stream.closed


async def test_a_deleted_session_ends_the_watch_with_its_error(setup) -> None:  # type: ignore[no-untyped-def]
    watches, engine, records, session = setup
    with pytest.raises(SessionNotFound):
        async with watches.watch(session, "", False) as events:
            records.session = None
            engine.streams[0].end(137)  # the container went away under the watcher
            async for _ in events:
                pass


async def test_a_suspended_session_ends_the_watch_as_not_running(setup) -> None:  # type: ignore[no-untyped-def]
    watches, engine, records, session = setup
    with pytest.raises(FailedPrecondition) as err:
        async with watches.watch(session, "", False) as events:
            records.session = dataclasses.replace(session, state=SessionState.SUSPENDED)
            engine.streams[0].end(-1)
            async for _ in events:
                pass
    assert err.value.reason == Reason.SESSION_NOT_RUNNING


async def test_garbage_before_ready_is_internal(setup) -> None:  # type: ignore[no-untyped-def]
    watches, engine, _, session = setup
    engine.script = [b"hello"]
    with pytest.raises(Internal):
        await _enter(watches, session, "")


async def test_a_channel_that_ends_with_the_sandbox_is_answered_by_the_sessions_state(  # type: ignore[no-untyped-def]
    setup,
) -> None:
    """The watcher's stream fails (the agent's channel closed by a Suspend): the caller hears
    SESSION_NOT_RUNNING, not the channel's error."""
    watches, engine, records, session = setup
    with pytest.raises(FailedPrecondition) as err:
        async with watches.watch(session, "", False) as events:
            records.session = dataclasses.replace(session, state=SessionState.SUSPENDED)
            engine.streams[0].fail(Unavailable("the agent channel ended"))
            async for _ in events:
                pass
    assert err.value.reason == Reason.SESSION_NOT_RUNNING
