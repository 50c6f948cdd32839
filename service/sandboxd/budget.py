"""Per-session budgets for server memory that callers make the server hold.

A listing or a file read is buffered whole before its reply goes out; without a budget one
session could have many of them in flight at once and grow the server by gigabytes. Holders
wait for room (bounded by their own deadlines); a single hold larger than the whole budget is
refused at once, before any work is done.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from sandboxd.errors import ResourceExhausted


class ByteBudget:
    """At most `limit` bytes held at once per key (a session id)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}
        self._users: dict[str, int] = {}  # holders and waiters; the key is dropped at 0
        self._room: dict[str, asyncio.Condition] = {}

    def held(self, key: str) -> int:
        return self._held.get(key, 0)

    @contextlib.asynccontextmanager
    async def hold(self, key: str, nbytes: int, what: str) -> AsyncIterator[None]:
        if nbytes > self.limit:
            raise ResourceExhausted(
                f"{what} may need {nbytes} bytes of server memory, over the session's buffer "
                f"budget of {self.limit}",
                reason="SESSION_BUFFER_BUDGET",
                metadata={"limit": str(self.limit)},
            )
        room = self._room.setdefault(key, asyncio.Condition())
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with room:
                await room.wait_for(lambda: self._held.get(key, 0) + nbytes <= self.limit)
                self._held[key] = self._held.get(key, 0) + nbytes
            try:
                yield
            finally:
                async with room:
                    self._held[key] -= nbytes
                    room.notify_all()
        finally:
            self._users[key] -= 1
            if not self._users[key]:
                del self._users[key], self._room[key]
                self._held.pop(key, None)
