"""One asyncio lock per session id: every change of a session's record or sandbox happens
under it (create, delete, renew, suspend, resume, expiry, reconcile decisions)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class SessionLocks:
    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def locked(self, session_id: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and not lock._waiters:  # no one else wants it: forget it
                self._locks.pop(session_id, None)
