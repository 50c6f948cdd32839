"""The forgets of agents' output copies under way (sandboxd.processes.forgets): owned per
session, awaited by a start and by shutdown, bounded, and nothing left once they are done."""

from __future__ import annotations

import asyncio

from sandboxd.errors import Unavailable
from sandboxd.processes.forgets import Forgets
from sandboxd.processes.record import AgentKept


class _Agent:
    def __init__(self) -> None:
        self.forgotten: list[str] = []
        self.gate = asyncio.Event()

    async def forget(self, container_id: str, detach_id: str) -> None:
        await self.gate.wait()
        if detach_id == "broken":
            raise Unavailable("the agent is gone")
        self.forgotten.append(detach_id)


async def test_a_sessions_forgets_are_awaited_and_leave_nothing_behind() -> None:
    agent, forgets = _Agent(), Forgets()
    forgets.send("s1", agent, AgentKept("c1", "a", 0))  # type: ignore[arg-type]
    forgets.send("s1", agent, AgentKept("c1", "broken", 0))  # type: ignore[arg-type]
    forgets.send("s2", agent, AgentKept("c2", "b", 0))  # type: ignore[arg-type]
    assert len(forgets.pending()) == 3
    waiting = asyncio.create_task(forgets.settled("s1"))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # a start in s1 waits for the agent's room
    agent.gate.set()
    await waiting  # a failed forget is not the waiter's error
    await forgets.settled("s2")
    assert sorted(agent.forgotten) == ["a", "b"]
    assert forgets.pending() == [] and forgets._by_session == {}
    await forgets.settled("s1")  # nothing under way: at once
