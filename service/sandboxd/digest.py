"""The SHA-256 of an archive transfer, hashed off the event loop by the server's own threads.

An archive imported or exported by a caller is recorded with the digest of its bytes as they
went over the wire (archive/calls.py); hashing a 48 MiB archive is tens of ms of CPU, so it is
done in batches on a small pool the server owns rather than on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

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
