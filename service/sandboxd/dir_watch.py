"""Directory watches (FilesystemService.WatchDir) over the in-sandbox `sbx watch`.

The watcher (helper/watch.c) runs inside the sandbox through the one helper client, so it
rides whatever carries Engine.exec (a `docker exec` or the agent's channel) and sees paths
exactly as the other file operations do: beneath /workspace, no symlink followed out. It
prints one JSON line per inotify event, `ready` once its watches are in place.

Here, per watch: the events are read as fast as the watcher prints them (so its own queue
stays short) into a bounded `WatchQueue`, which coalesces MODIFIED per file, numbers what it
hands out, and, when the client reads slower than the changes come, drops events for one
OVERFLOW event in their place: a caller always learns that it must list again. A watch ends
when the client cancels (the watcher's stdin is closed and its exec ended: nothing is left
running in the sandbox) or when the session's sandbox goes away (delete, suspend, expiry),
which ends the watcher's output; the session's state then says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from sandboxd import validation
from sandboxd.config_sections import WatchSection
from sandboxd.engine import ExecStream
from sandboxd.errors import (
    FailedPrecondition,
    Internal,
    ResourceExhausted,
    SandboxError,
    SessionNotFound,
)
from sandboxd.helper_client import STDERR_LIMIT, HelperClient, HelperResult, file_error
from sandboxd.models import FileType, Session, SessionState
from sandboxd.reasons import Reason

MAX_LINE = 64 * 1024  # one event: two paths of at most PATH_MAX, escaped
# How long a watch whose watcher ended looks for the session's change of state (about 10 s).
_SETTLE_DELAYS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 3.0)


class FileEventKind(StrEnum):
    CREATED = "created"
    MODIFIED = "modified"
    REMOVED = "removed"
    RENAMED = "renamed"
    ATTRIBUTES = "attributes"
    OVERFLOW = "overflow"


_TYPES = {
    "file": FileType.FILE,
    "dir": FileType.DIRECTORY,
    "symlink": FileType.SYMLINK,
    "other": FileType.OTHER,
}


@dataclass(frozen=True)
class FileEvent:
    """One change; `sequence` is set when the event is handed to the client (1, 2, 3...)."""

    kind: FileEventKind
    path: str
    old_path: str = ""
    type: FileType | None = None
    sequence: int = 0


def parse_event(line: bytes) -> FileEvent | None:
    """An event line of `sbx watch`; None for `ready` (and kinds this server does not know)."""
    try:
        doc = json.loads(line)
        kind = FileEventKind(doc["kind"])
    except (ValueError, KeyError, TypeError):
        return None
    return FileEvent(
        kind=kind,
        path=str(doc.get("path", "")),
        old_path=str(doc.get("old_path", "")),
        type=_TYPES.get(str(doc.get("type", ""))),
    )


@dataclass
class _Queued:
    event: FileEvent
    ready_at: float


@dataclass
class WatchQueue:
    """The events of one watch on their way to a client that may be slower than they come.

    MODIFIED of a file is held `coalesce_s` and merged with later MODIFIED of that file while
    it waits (so the client hears of it after the last write it covers, never before); an
    event about that path in between ends the merging, so order is kept. More than `limit`
    waiting events: the new ones are dropped and one OVERFLOW takes their place.
    """

    limit: int
    coalesce_s: float
    clock: Callable[[], float] = time.monotonic
    _items: deque[_Queued] = field(default_factory=deque)
    _last: dict[str, _Queued] = field(default_factory=dict)
    _lost: bool = False
    _closed: bool = False
    _sequence: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def put(self, event: FileEvent) -> None:
        self._make_room_for_overflow()
        if event.kind is FileEventKind.OVERFLOW:
            self._lost = True
            self._make_room_for_overflow()
            return
        if event.kind is FileEventKind.MODIFIED:
            last = self._last.get(event.path)
            if last is not None and last.event.kind is FileEventKind.MODIFIED:
                return  # merged into the one still waiting
        if self._lost or len(self._items) >= self.limit:
            self._lost = True
            return
        hold = self.coalesce_s if event.kind is FileEventKind.MODIFIED else 0.0
        self._append(event, hold)

    def close(self) -> None:
        """No more events will come: `get` answers None once the queue is empty."""
        self._closed = True
        self._changed.set()

    @property
    def waiting(self) -> int:
        return len(self._items)

    async def get(self) -> FileEvent | None:
        while True:
            if self._items:
                head = self._items[0]
                wait = head.ready_at - self.clock()
                if wait <= 0:
                    return self._take()
                await asyncio.sleep(wait)
                continue
            if self._closed:
                return None
            self._changed.clear()
            await self._changed.wait()

    def _append(self, event: FileEvent, hold: float) -> None:
        queued = _Queued(event, self.clock() + hold)
        self._items.append(queued)
        for path in (event.path, event.old_path):
            if path:
                self._last[path] = queued
        self._changed.set()

    def _make_room_for_overflow(self) -> None:
        if self._lost and len(self._items) < self.limit:
            tail = self._items[-1].event if self._items else None
            self._lost = False
            if tail is None or tail.kind is not FileEventKind.OVERFLOW:
                self._append(FileEvent(FileEventKind.OVERFLOW, ""), 0.0)

    def _take(self) -> FileEvent:
        queued = self._items.popleft()
        for path in (queued.event.path, queued.event.old_path):
            if path and self._last.get(path) is queued:
                del self._last[path]
        self._sequence += 1
        self._make_room_for_overflow()
        e = queued.event
        return FileEvent(e.kind, e.path, e.old_path, e.type, sequence=self._sequence)


class SessionRecords(Protocol):
    async def get(self, session_id: str) -> Session:
        """The session's record (read only); SessionNotFound when it is gone."""
        ...


class DirWatches:
    """Every open WatchDir of this server: at most `max_per_session` per session."""

    def __init__(self, helper: HelperClient, sessions: SessionRecords, settings: WatchSection):
        self._helper = helper
        self._sessions = sessions
        self._settings = settings
        self._open: Counter[str] = Counter()

    def open_count(self, session_id: str) -> int:
        return self._open[session_id]

    @contextlib.asynccontextmanager
    async def watch(
        self, session: Session, path: str, recursive: bool
    ) -> AsyncIterator[AsyncIterator[FileEvent]]:
        """A watch in place (changes from now on are reported): its events as they come."""
        rel = validation.workspace_relpath(path or ".")
        sid = session.session_id
        limit = self._settings.max_per_session
        if self._open[sid] >= limit:
            raise ResourceExhausted(
                f"session {sid!r} already has {limit} open WatchDir streams "
                "(watch_max_per_session); end one first",
                reason=Reason.WATCH_LIMIT,
                metadata={"session_id": sid, "limit": str(limit)},
            )
        self._open[sid] += 1
        try:
            args = [
                "watch",
                rel,
                "--max-watches",
                str(self._settings.max_directories),
                "--queue",
                str(self._settings.queue),
                *(["--recursive"] if recursive else []),
            ]
            async with self._helper.open(session, args, stdin=True) as stream:
                lines = _lines(stream)
                stderr = bytearray()
                try:
                    await _until_ready(lines, stream, stderr, rel)
                    queue = WatchQueue(self._settings.queue, self._settings.coalesce_s)
                    pump = asyncio.create_task(_pump(lines, queue))
                    try:
                        yield self._events(queue, pump, session, stream)
                    finally:
                        # Its failure, if any, was answered by _events (or the watch was left).
                        pump.cancel()
                        with contextlib.suppress(asyncio.CancelledError, SandboxError):
                            await pump
                finally:
                    await lines.aclose()
                    with contextlib.suppress(Exception):
                        stream.close_stdin()  # the watcher exits on its stdin's end
                    await stream.close()
        finally:
            self._open[sid] -= 1
            if not self._open[sid]:
                del self._open[sid]

    async def _events(
        self, queue: WatchQueue, pump: asyncio.Task[None], session: Session, stream: ExecStream
    ) -> AsyncIterator[FileEvent]:
        while (event := await queue.get()) is not None:
            yield event
        # The watcher ended on its own: the watched directory went away (exit 0, its REMOVED
        # event the last), or the sandbox did (its output ends, or the engine fails the read).
        failure: SandboxError | None = None
        code: int | None = None
        try:
            await pump
            code = await stream.wait_exit_code()
        except SandboxError as exc:
            failure = exc
        if code == 0:
            return
        # A Delete or Suspend removes the sandbox before it updates the record: give it a
        # moment, then the session's state says why the watch ended. Past that, the error goes
        # to SessionManager.use, which asks again under the session's lock.
        for delay in _SETTLE_DELAYS:
            await asyncio.sleep(delay)
            await self._still_running(session)
        raise failure or Internal(f"the watcher ended (exit {code}) while its session runs")

    async def _still_running(self, session: Session) -> None:
        """Nothing when `session` still runs; else why the watch ended (never a resume)."""
        sid = session.session_id
        current = await self._sessions.get(sid)
        if current.created_at != session.created_at:
            raise SessionNotFound(sid)
        if current.state is not SessionState.RUNNING:
            raise FailedPrecondition(
                f"session {sid!r} is {current.state.value} now; its watches ended",
                reason=Reason.SESSION_NOT_RUNNING,
                metadata={"session_id": sid, "state": current.state.value},
            )


async def _lines(stream: ExecStream) -> AsyncGenerator[tuple[int, bytes], None]:
    """(fd, line) of the watcher's stdout (fd 1) and stderr chunks (fd 2), as they come."""
    pending = bytearray()
    while (chunk := await stream.read()) is not None:
        fd, data = chunk
        if fd != 1:
            yield fd, data
            continue
        pending += data
        while (nl := pending.find(b"\n")) >= 0:
            line = bytes(pending[:nl])
            del pending[: nl + 1]
            yield 1, line
        if len(pending) > MAX_LINE:
            raise Internal("the watcher printed a line longer than any event")


async def _until_ready(
    lines: AsyncIterator[tuple[int, bytes]], stream: ExecStream, stderr: bytearray, rel: str
) -> None:
    """Wait for `ready`; a watcher that ends first failed: its error as the file op's."""
    async for fd, data in lines:
        if fd != 1:
            stderr += data[: STDERR_LIMIT - len(stderr)]
            continue
        doc: Any = None
        with contextlib.suppress(ValueError):
            doc = json.loads(data)
        if isinstance(doc, dict) and doc.get("kind") == "ready":
            return
        raise Internal(f"the watcher printed {data[:200]!r} before it was ready")
    code = await stream.wait_exit_code()
    raise file_error(HelperResult(code, b"", bytes(stderr)), rel)


async def _pump(lines: AsyncIterator[tuple[int, bytes]], queue: WatchQueue) -> None:
    """The watcher's events into the queue, as fast as it prints them."""
    try:
        async for fd, data in lines:
            if fd == 1 and (event := parse_event(data)) is not None:
                queue.put(event)
    finally:
        queue.close()
