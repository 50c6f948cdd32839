"""Per session: calls that change or read the workspace (shared) against the ones that carry it
away (exclusive: a snapshot, a Suspend), so that each sees it whole.

Without it a WriteFile could answer OK after a Suspend had taken its snapshot and before it
removed the sandbox: the write was then lost on resume. With it, a snapshot holds the tree
before or after each file call and each import, never between.

Commands (Exec, Run, Interact) do not take the gate: they may run for as long as their
timeout, and a Suspend ends them anyway. Writers go first: a waiting exclusive call stops new
shared ones from starting, so a busy session cannot starve a snapshot. Every state change is
synchronous (no await between the check and the count), so a cancelled waiter leaves nothing
behind.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class _Entry:
    readers: int = 0
    writer: bool = False
    writers_waiting: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    @property
    def idle(self) -> bool:
        return not self.readers and not self.writer and not self.writers_waiting


class WorkspaceGate:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def _entry(self, session_id: str) -> _Entry:
        return self._entries.setdefault(session_id, _Entry())

    def _release(self, session_id: str, entry: _Entry) -> None:
        entry.wake()
        if entry.idle and self._entries.get(session_id) is entry:
            del self._entries[session_id]

    @contextlib.asynccontextmanager
    async def shared(self, session_id: str) -> AsyncIterator[None]:
        entry = self._entry(session_id)
        while entry.writer or entry.writers_waiting:
            await entry.changed.wait()
        entry.readers += 1
        try:
            yield
        finally:
            entry.readers -= 1
            self._release(session_id, entry)

    @contextlib.asynccontextmanager
    async def exclusive(self, session_id: str) -> AsyncIterator[None]:
        entry = self._entry(session_id)
        entry.writers_waiting += 1
        try:
            while entry.writer or entry.readers:
                await entry.changed.wait()
        except BaseException:
            entry.writers_waiting -= 1
            self._release(session_id, entry)
            raise
        entry.writers_waiting -= 1
        entry.writer = True
        try:
            yield
        finally:
            entry.writer = False
            self._release(session_id, entry)
