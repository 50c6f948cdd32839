"""The queues between the event loop and the import thread, and the file-likes on them.

The import parses tar on a thread of its own (tarfile is blocking); the client's chunks reach
it through the `Inbox`, the sanitised archive leaves it through the `Outbox`. Both are bounded
by bytes, so a fast client or a slow container holds at most a few MiB here, and neither side
makes a round trip per chunk. `Source` is what tarfile reads (forward only, member data as
views, extension records capped before they are read); `Sink` is what the thread writes.

Nothing here knows tar's rules (policy.py) or containers (transfer.py): tests drive both
ends with a fake consumer.
"""

from __future__ import annotations

import asyncio
import collections
import tarfile
import threading
from typing import Protocol, TypeVar

from sandboxd.archive import policy
from sandboxd.errors import ResourceExhausted
from sandboxd.reasons import Reason

INBOX_BYTES = 1024 * 1024  # client chunks read ahead for the import thread (one always fits)
OUTBOX_BYTES = 1024 * 1024  # sanitised output queued for the container, plus a batch in writing
INBOX_WAKE = 256 * 1024  # a waiting import thread is woken once this much is queued (or at the end)
INBOX_LINGER_S = 0.002  # ... or this long after a chunk arrived for it, whatever came since
OUT_BATCH = 256 * 1024  # the import thread hands its output over in batches of this size
BLOCK = tarfile.BLOCKSIZE
_TAIL_BYTES = 4 * BLOCK  # what the import's source remembers for the end-of-archive check
_PAX_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)

T = TypeVar("T")


class Cancelled(Exception):
    """The import was abandoned by the loop side."""


class SinkError(Exception):
    """Writing to the container failed; not the archive's fault."""


def wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Inbox:
    """The client's chunks on their way from the loop (a feeder task) to the import thread.

    Bounded by bytes (one chunk always fits, however large). Neither side makes a round trip
    per chunk: the thread takes what is there and blocks only when nothing is; a thread that
    waits is woken once `INBOX_WAKE` bytes (a quarter of the bound, so the feeder never waits
    for room meanwhile) or the end arrived, or `INBOX_LINGER_S` after the first chunk it has
    not seen (a client that pauses is answered as before), not for each chunk (each wake is a
    switch of the GIL); the feeder is woken from the thread only when it waited for room, once
    half the room is free again.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._loop = loop
        self._limit = limit
        self._cond = threading.Condition()
        self._items: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._ended = False
        self._error: BaseException | None = None
        self._cancelled = False
        self._discard = False
        self._room: asyncio.Future[None] | None = None
        self._thread_waits = False
        self._nudged = False  # the linger ran out: the waiting thread takes what is there
        self._linger: asyncio.TimerHandle | None = None
        self._wake_at = min(INBOX_WAKE, limit)
        self.discarded = 0  # bytes dropped after the archive's end

    async def put(self, data: bytes) -> None:
        """Loop side: queue a chunk, waiting while the inbox is full."""
        while True:
            with self._cond:
                if self._discard:
                    self.discarded += len(data)
                    return
                if self._cancelled:
                    return
                if self._size < self._limit:
                    self._items.append(data)
                    self._size += len(data)
                    if self._thread_waits:
                        if self._size >= self._wake_at:
                            self._cond.notify()
                        elif self._linger is None:
                            self._linger = self._loop.call_later(INBOX_LINGER_S, self._nudge)
                    return
                room = self._room = self._loop.create_future()
            await room

    def _nudge(self) -> None:
        with self._cond:
            self._linger = None
            if self._thread_waits and self._items:
                self._nudged = True
                self._cond.notify()

    def end(self, error: BaseException | None = None) -> None:
        """Loop side: no more chunks; with `error`, the thread raises it once it gets there."""
        with self._cond:
            self._ended = True
            self._error = error
            self._cond.notify()

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def discarding(self) -> bool:
        """The archive has ended: what still comes is dropped."""
        return self._discard

    def discard(self) -> None:
        """Loop side, once the thread is done: drop what comes after the archive's end."""
        with self._cond:
            self._discard = True
            self._items.clear()
            self._size = 0
            if self._room is not None:
                room, self._room = self._room, None
                wake(room)

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def get(self) -> bytes | None:
        """Thread side: the next chunk, None at the end of the client's stream."""
        with self._cond:
            while not self._items and not self._cancelled:
                if self._ended:
                    if self._error is not None:
                        raise self._error
                    return None
                self._thread_waits = True
                try:
                    while not (self._ended or self._cancelled or self._nudged) and (
                        self._size < self._wake_at
                    ):
                        self._cond.wait()
                finally:
                    self._thread_waits = self._nudged = False
            if self._cancelled:
                raise Cancelled
            data = self._items.popleft()
            self._size -= len(data)
            if self._room is not None and self._size <= self._limit // 2:
                room, self._room = self._room, None
                self._loop.call_soon_threadsafe(wake, room)
            return data


class Outbox:
    """Sanitised output on its way from the import thread to the loop's writer task.

    Bounded by bytes: the thread blocks while it is full (backpressure from the container's
    stdin); the writer takes everything queued at once and is woken only when it waited.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._loop = loop
        self._limit = limit
        self._cond = threading.Condition()
        self._items: list[bytes] = []
        self._size = 0
        self._closed = False  # no more output: the writer ends once it has written the rest
        self._gone = False  # the writer stopped taking (tar is gone)
        self._cancelled = False
        self._waiter: asyncio.Future[None] | None = None

    def put(self, data: bytes) -> None:
        """Thread side: queue output, blocking while full; SinkError once tar is gone."""
        with self._cond:
            while self._size >= self._limit and not (self._gone or self._cancelled):
                self._cond.wait()
            if self._cancelled and not self._gone:
                raise Cancelled
            if self._gone:
                raise SinkError("tar exited early")
            self._items.append(data)
            self._size += len(data)
            if self._waiter is not None:
                waiter, self._waiter = self._waiter, None
                self._loop.call_soon_threadsafe(wake, waiter)

    async def take(self) -> list[bytes] | None:
        """Loop side: everything queued (waiting for some), None once closed and empty."""
        while True:
            with self._cond:
                if self._items:
                    items, self._items, self._size = self._items, [], 0
                    self._cond.notify()
                    return items
                if self._closed:
                    return None
                waiter = self._waiter = self._loop.create_future()
            await waiter

    def close(self) -> None:
        """Loop side: the thread is done; the writer stops once the queue is empty."""
        with self._cond:
            self._closed = True
            if self._waiter is not None:
                waiter, self._waiter = self._waiter, None
                wake(waiter)

    def gone(self) -> None:
        """tar exited or its stdin broke: the thread's next write fails at once."""
        with self._cond:
            self._gone = True
            self._items, self._size = [], 0
            self._cond.notify_all()

    @property
    def is_gone(self) -> bool:
        return self._gone

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()


class Chunks(Protocol):
    """Where a Source's bytes come from: an Inbox, or the decoder over one (compressed.py)."""

    def get(self) -> bytes | None: ...


class Source:
    """A forward-only file-like view of the client's chunks, for tarfile's `r:` mode.

    tarfile reads only headers through read(); member data is passed on by the import
    thread itself as views of the chunks as they came (read_view), never copied on the way.
    Remembers the last bytes handed out so that, when tarfile stops, we can tell a proper end
    (a zero block) from a truncated or garbage tail, which tarfile ends on silently.
    """

    def __init__(self, inbox: Chunks) -> None:
        self._inbox = inbox
        self._chunk = b""
        self._at = 0  # read position in self._chunk
        self._eof = False
        self.position = 0  # bytes handed out (or skipped) so far
        self._tail = b""  # the last bytes handed out, ending at self.position
        self._pax_next = False  # the last header announced a PAX record

    def _fill(self) -> bool:
        """Make the current chunk non-empty; False at the end of the stream."""
        while self._at >= len(self._chunk):
            if self._eof:
                return False
            data = self._inbox.get()
            if data is None:
                self._eof = True
                return False
            self._chunk, self._at = data, 0
        return True

    def read_view(self, n: int) -> memoryview:
        """Up to `n` bytes (fewer at a chunk's end, none at the stream's end), not copied."""
        if n <= 0 or not self._fill():
            return memoryview(b"")
        end = min(len(self._chunk), self._at + n)
        view = memoryview(self._chunk)[self._at : end]
        self._at = end
        self.position += len(view)
        self._tail = b""  # member data is never looked back at: only what read() handed out
        return view

    def read(self, n: int = -1) -> bytes:
        """Only tarfile calls this, for header blocks and PAX/GNU extension records: those
        are capped before a byte is read, and a PAX record is checked before tarfile parses
        it (policy.py says why)."""
        if n < 0 or n > BLOCK:
            policy.check_extended_header(n if n >= 0 else 1 << 62)
        pax, self._pax_next = self._pax_next, False
        out = self._read(n)
        if pax:
            policy.check_extended_payload(out)
        elif n == BLOCK and len(out) == BLOCK and out[156:157] in _PAX_TYPES:
            self._pax_next = True  # tarfile reads the record next
        return out

    def _read(self, n: int) -> bytes:
        parts: list[bytes] = []
        want = n
        while want != 0 and self._fill():
            end = len(self._chunk) if want < 0 else min(len(self._chunk), self._at + want)
            parts.append(self._chunk[self._at : end])
            want -= 0 if want < 0 else end - self._at
            self._at = end
        out = parts[0] if len(parts) == 1 else b"".join(parts)
        self._remember(out)
        return out

    def _remember(self, data: bytes) -> None:
        self.position += len(data)
        if len(data) >= _TAIL_BYTES:
            self._tail = data[-_TAIL_BYTES:]
        else:
            self._tail = (self._tail + data)[-_TAIL_BYTES:]

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = 0) -> int:
        """Forward only (tarfile skips the padding after a member's data this way)."""
        if whence != 0 or offset < self.position:
            raise OSError("the archive stream cannot seek backwards")
        while self.position < offset and self._fill():
            step = min(len(self._chunk) - self._at, offset - self.position)
            self._at += step
            self.position += step
            self._tail = b""
        return self.position

    def block_at(self, offset: int) -> bytes | None:
        """The 512 bytes at `offset` if they were read; fewer if the stream ended there."""
        if offset + BLOCK > self.position:
            if offset > self.position:
                return None
            self._read(offset + BLOCK - self.position)
        start = len(self._tail) - (self.position - offset)
        if start < 0:
            return None
        return self._tail[start : start + BLOCK]


class Sink:
    """Collects the sanitised archive on the import thread and hands it to the outbox in
    batches of OUT_BATCH bytes, for the loop's writer task to send to the container's `tar -x`.
    A tar that gives up (no room) ends the import: nothing is unpacked again.
    """

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self.limit: int | None = None  # most bytes that may be written so far (the caller's)
        self._parts: list[bytes | memoryview] = []
        self._size = 0
        self.written = 0  # bytes of sanitised archive so far

    @property
    def gone(self) -> bool:
        return self._outbox.is_gone

    def tar_gone(self) -> None:
        """tar exited or its stdin broke before the input ended: stop feeding it."""
        self._outbox.gone()

    def _account(self, n: int) -> None:
        """Every byte counts against `limit`: headers and link targets as much as data."""
        if self.limit is not None and self.written + n > self.limit:
            raise ResourceExhausted(
                f"the archive's members, headers and link targets come to more than "
                f"{self.limit} bytes, the workspace cap plus tar's overhead",
                reason=Reason.WORKSPACE_FULL,
                metadata={"limit": str(self.limit)},
            )
        self.written += n

    def write(self, data: bytes | memoryview) -> None:
        """Bytes the thread wrote (headers, padding, the end)."""
        self._account(len(data))
        self._parts.append(data)
        self._size += len(data)
        if self._size >= OUT_BATCH:
            self.flush()

    def content(self, view: memoryview, start: int) -> None:
        """A checked member's content as it came: `view`, at offset `start` of the source."""
        del start  # passed on as it is (a RecipeSink names the range instead)
        self.write(view)

    def flush(self) -> None:
        if not self._parts:
            return
        payload = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        payload = bytes(payload) if isinstance(payload, memoryview) else payload
        self._parts, self._size = [], 0
        self._put(payload)

    def _put(self, payload: bytes) -> None:
        try:
            self._outbox.put(payload)
        except (SinkError, Cancelled) as exc:
            if isinstance(exc, Cancelled) and not self.gone:
                raise
            raise SinkError(str(exc)) from exc


def settle(fut: asyncio.Future[T], result: T | BaseException) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


async def join_thread(thread: threading.Thread) -> None:
    while thread.is_alive():
        await asyncio.sleep(0.01)
