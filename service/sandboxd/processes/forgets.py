"""The agent's copies of process output that the server dropped, being forgotten.

When the server drops a process record (room for another, the session ended), the agent's ring
of that process's output goes too: a `forget` sent in a task this owns, per session. A start
in that session waits for them first, so the agent never holds more records than the server
(the agent's own limit is 128); shutdown waits for all of them.
"""

from __future__ import annotations

import asyncio
import contextlib

from sandboxd.commands import DetachedExecs
from sandboxd.errors import SandboxError
from sandboxd.processes.record import AgentKept

FORGET_TIMEOUT_S = 5.0


async def forget(detached: DetachedExecs, kept: AgentKept) -> None:
    """One forget, bounded; an agent that is gone or slow has nothing left to free here."""
    with contextlib.suppress(SandboxError, ConnectionError, TimeoutError):
        async with asyncio.timeout(FORGET_TIMEOUT_S):
            await detached.forget(kept.container_id, kept.detach_id)


class Forgets:
    """The forgets under way, per session."""

    def __init__(self) -> None:
        self._by_session: dict[str, set[asyncio.Task[None]]] = {}

    def send(self, session_id: str, detached: DetachedExecs, kept: AgentKept) -> None:
        task = asyncio.create_task(forget(detached, kept), name=f"forget {kept.detach_id}")
        tasks = self._by_session.setdefault(session_id, set())
        tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            tasks.discard(t)
            if not tasks and self._by_session.get(session_id) is tasks:
                del self._by_session[session_id]  # no empty set left per ended session

        task.add_done_callback(done)

    async def settled(self, session_id: str) -> None:
        """Once the session's forgets sent so far are done (each is bounded)."""
        if tasks := self._by_session.get(session_id):
            await asyncio.wait(set(tasks))

    def pending(self) -> list[asyncio.Task[None]]:
        return [t for ts in self._by_session.values() for t in ts]
