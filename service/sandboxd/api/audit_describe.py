"""What each audited RPC says about itself: proto messages -> an audit event's kind and attributes.

A `Tally` follows one call: it sees the request (or each streamed request), each reply, and says
when the call's outcome is known (`final`: Run's reply, Exec's `exited` event, an import's reply)
so the interceptor records the event before that reply reaches the caller. Read-only RPCs have no
tally and are recorded only when refused.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any


def _duration_s(d: Any) -> str:
    return f"{d.seconds + d.nanos / 1e9:.3f}"


def _exit_attrs(exited: Any) -> dict[str, object]:
    return {
        "exit_code": exited.exit_code,
        "signal": exited.signal or None,
        "timed_out": exited.timed_out,
        "truncated": exited.truncated,
        "duration_s": _duration_s(exited.duration),
    }


HASH_BATCH = 1024 * 1024  # bytes handed to a hashing thread at once
HASH_BACKLOG = 4  # batches in flight per transfer; past that the transfer waits for the oldest
HASH_THREADS = 2


@contextlib.asynccontextmanager
async def hashing_threads(
    threads: int = HASH_THREADS,
) -> AsyncIterator[concurrent.futures.ThreadPoolExecutor]:
    """The threads that hash transfers for their audit record, owned by the server.

    hashlib releases the GIL on large updates, so a 48 MiB archive's SHA-256 (tens of ms of
    CPU) leaves the event loop free. The server enters this before its audit writer, so the
    threads stop after the gRPC server stopped and the last call's record was written; the
    wait for a batch still being hashed (a cancelled call's) runs off the loop.
    """
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="audit-sha256")
    try:
        yield pool
    finally:
        await asyncio.to_thread(pool.shutdown, wait=True)


class Digest:
    """The SHA-256 of a transfer's bytes, in order, computed off the event loop.

    Chunks are kept until a batch of `HASH_BATCH` bytes is complete, then hashed by one of
    `hashers`; each batch waits for the one before it (submitted earlier, so already taken by
    a thread: no batch ever waits for a later one). At most `HASH_BACKLOG` batches are in
    flight (a few MiB): past that `update` awaits the oldest, so a starved thread slows the
    transfer (its stream is not read or written meanwhile) rather than make the server hold
    a whole archive, and the loop is never blocked. A small transfer never leaves the loop.
    """

    def __init__(self, hashers: concurrent.futures.Executor) -> None:
        self._hashers = hashers
        self._hash = hashlib.sha256()
        self._parts: list[bytes] = []
        self._size = 0
        self._inflight: collections.deque[concurrent.futures.Future[None]] = collections.deque()

    async def update(self, data: bytes) -> None:
        self._parts.append(data)
        self._size += len(data)
        if self._size >= HASH_BATCH:
            await self._flush()

    async def _flush(self) -> None:
        parts, self._parts, self._size = self._parts, [], 0
        while self._inflight and self._inflight[0].done():
            self._inflight.popleft().result()
        if len(self._inflight) >= HASH_BACKLOG:
            # The threads lag (a starved host): the transfer waits for the oldest batch, one
            # batch's hashing at most, rather than hold ever more of it.
            await asyncio.wrap_future(self._inflight.popleft())
        previous = self._inflight[-1] if self._inflight else None
        self._inflight.append(self._hashers.submit(_hash_after, self._hash, previous, parts))

    async def hexdigest(self) -> str:
        """Every byte so far, once the threads are done (they never wait for the loop)."""
        if self._inflight:
            await asyncio.wrap_future(self._inflight[-1])
            self._inflight.clear()
        for part in self._parts:
            self._hash.update(part)
        self._parts, self._size = [], 0
        return self._hash.hexdigest()


def _hash_after(
    digest: Any, previous: concurrent.futures.Future[None] | None, parts: list[bytes]
) -> None:
    if previous is not None:
        previous.result()  # submitted earlier, so already running or done: never a deadlock
    for part in parts:
        digest.update(part)


class Tally:
    """The audit record of one call in the making."""

    def __init__(self, method: str, hashers: concurrent.futures.Executor) -> None:
        self.method = method
        self._hashers = hashers  # where a transfer's digest is hashed
        self.kind = ""
        self.session_id = ""
        self.attributes: dict[str, object] = {}
        self._out_bytes = 0
        self._in_bytes = 0
        self._digest: Digest | None = None

    # Requests ---------------------------------------------------------------------------------

    async def request(self, request: Any) -> None:
        """Each request message (one for unary calls, each for client streams); awaits when a
        transfer's hashing lags (the caller reads no further request meanwhile)."""
        m = self.method
        sid = getattr(request, "session_id", None)
        if isinstance(sid, str) and sid and not self.session_id:
            self.session_id = sid
        if m in ("ProcessService/Run", "ProcessService/Exec", "ProcessService/StartProcess"):
            self._command(request)
        elif m == "ProcessService/Interact" and request.HasField("start"):
            self.session_id = request.start.request.session_id
            self._command(request.start.request)
            self.attributes["pty"] = request.start.HasField("pty")
        elif m == "SnapshotService/ExportArchive":
            self.kind = "archive_export"
            self.attributes["path"] = request.path
            self._digest = Digest(self._hashers)
        elif m == "SnapshotService/ImportArchive":
            self.kind = "archive_import"
            if request.HasField("header"):
                self.session_id = request.header.session_id
                self.attributes.update(path=request.header.path, replace=request.header.replace)
                self._digest = Digest(self._hashers)
            elif self._digest is not None:
                data = request.data  # each read of a bytes field is a copy: one per message
                self._in_bytes += len(data)
                await self._digest.update(data)

    def _command(self, request: Any) -> None:
        self.kind = "command"
        self.attributes.update(argv=list(request.argv), cwd=request.cwd or "/workspace")
        if self.method == "ProcessService/StartProcess":
            self.attributes["background"] = True

    # Replies ----------------------------------------------------------------------------------

    async def reply(self, reply: Any) -> bool:
        """Each reply message; True when it is the one that tells the caller the outcome.
        Awaits when a transfer's hashing lags (the reply is passed on after)."""
        m = self.method
        if m == "ProcessService/Run":
            self.attributes.update(_exit_attrs(reply))
            self.attributes.update(
                stdout_bytes=len(reply.stdout),
                stderr_bytes=len(reply.stderr),
                process_id=reply.process_id or None,
            )
            return True
        if m in ("ProcessService/Exec", "ProcessService/Interact"):
            event = reply.WhichOneof("event")
            if event == "started":
                self.attributes["process_id"] = reply.started.process_id
            elif event == "output":
                self._out_bytes += len(reply.output.data)
            elif event == "exited":
                self.attributes.update(_exit_attrs(reply.exited))
                self.attributes["output_bytes"] = self._out_bytes
                return True
            return False
        if m == "ProcessService/StartProcess":
            self.attributes["process_id"] = reply.process.process_id
            return True
        if m == "SnapshotService/ExportArchive":
            data = reply.chunk.data
            self._out_bytes += len(data)
            if self._digest is not None:
                await self._digest.update(data)
            return False
        if m == "SnapshotService/ImportArchive":
            self.attributes.update(
                files=reply.files,
                bytes_written=reply.bytes,
                tar_bytes=self._in_bytes,
                sha256=None,  # set by `settle`, once the hashing threads are done
            )
            return True
        return True

    def ended(self) -> None:
        """A server stream ran to its end (ExportArchive: the totals are known now)."""
        if self.method == "SnapshotService/ExportArchive" and self._digest is not None:
            self.attributes["tar_bytes"] = self._out_bytes

    async def settle(self) -> None:
        """Before the record is written: the transfer's SHA-256, hashed off the loop."""
        if self._digest is not None and "tar_bytes" in self.attributes:
            self.attributes["sha256"] = await self._digest.hexdigest()


def audited(method: str) -> bool:
    """Is a successful call of `method` (`Service/Method`) an audit event?"""
    return method in _AUDITED


_AUDITED = frozenset(
    {
        "ProcessService/Run",
        "ProcessService/Exec",
        "ProcessService/Interact",
        "ProcessService/StartProcess",
        "SnapshotService/ExportArchive",
        "SnapshotService/ImportArchive",
    }
)
