"""Each session's own host identity: a uid (and the gid of the same number) from a block the
operator sets aside (`host_uid_first`, `host_uid_count`), held by no other session.

Why: sandboxes have no user namespace (Docker's userns-remap is one mapping for the whole
daemon, so it would not part tenants either), so a sandbox's uid is a host uid, and every
count the kernel keeps per uid (inotify instances and watches, pipe buffer pages, POSIX
message-queue bytes, RLIMIT_NPROC, keys) is one pool for all the sessions sharing it. With
one uid per session, one session exhausting such a count reaches only itself.

The store is the durable truth: an id is taken while any session record holds it (running,
suspended, ended and not yet pruned, adopted after a restart); deleting the record frees it.
In memory only are the ids chosen but not yet written (a create between its choice and its
record) and those of warm-pool containers, which have no record: `take` holds an id until
`release`, so nothing is handed out twice in between. Choices are random within the free
ids, so servers sharing one host with the default block rarely meet (each server owns a
block of its own where that matters: SECURITY.md "Host identity of each sandbox").
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Protocol

from sandboxd.config import Config
from sandboxd.errors import ResourceExhausted
from sandboxd.reasons import Reason


class _Records(Protocol):
    async def host_ids_between(self, first: int, last: int) -> set[int]: ...


class HostIds:
    """Allocates host uids from [first, first + count); one lock orders every choice."""

    def __init__(self, records: _Records, first: int, count: int) -> None:
        self._records = records
        self.first = first
        self.last = first + count - 1
        self._held: set[int] = set()
        self._lock = asyncio.Lock()

    @classmethod
    def for_config(cls, config: Config, records: _Records) -> HostIds:
        return cls(records, config.engine.host_uid_first, config.engine.host_uid_count)

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    async def take(self) -> int:
        """A free id, held until `release`: in no record and held by no one else now.

        RESOURCE_EXHAUSTED HOST_IDS_EXHAUSTED when every id of the block is in use."""
        async with self._lock:
            used = await self._records.host_ids_between(self.first, self.last) | self._held
            if len(used) >= self.count:
                raise ResourceExhausted(
                    f"every host uid this server allocates to sessions is in use ({self.count}, "
                    f"{self.first}-{self.last}); delete sessions, or the operator widens "
                    "host_uid_count",
                    reason=Reason.HOST_IDS_EXHAUSTED,
                    metadata={"host_uid_count": str(self.count)},
                )
            start = secrets.randbelow(self.count)
            for step in range(self.count):
                uid = self.first + (start + step) % self.count
                if uid not in used:
                    self._held.add(uid)
                    return uid
        raise AssertionError("a free id was counted but not found")  # pragma: no cover

    def release(self, uid: int) -> None:
        """The holder is done: its record holds the id now, or nothing uses it any more."""
        self._held.discard(uid)

    @contextlib.asynccontextmanager
    async def holding(self) -> AsyncIterator[int]:
        """An id held for the block's length: write the record that takes it inside."""
        uid = await self.take()
        try:
            yield uid
        finally:
            self.release(uid)
