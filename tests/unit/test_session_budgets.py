"""Unit tests of the per-session memory budgets: buffered listings and reads (ByteBudget) and
background processes' output rings (ProcessManager)."""

from __future__ import annotations

import asyncio

import pytest
from sandboxd.budget import ByteBudget
from sandboxd.errors import ResourceExhausted
from sandboxd.models import ExecExited, ExecSpec
from sandboxd.processes import BackgroundProcess
from sandboxd.processes import budget as process_room
from sandboxd.processes import manager as processes

MiB = 1024 * 1024


async def test_a_hold_larger_than_the_budget_is_refused_before_any_work() -> None:
    budget = ByteBudget(10)
    with pytest.raises(ResourceExhausted) as exc:
        async with budget.hold("s", 11, "ListDir"):
            raise AssertionError("not reached")
    assert exc.value.reason == "SESSION_BUFFER_BUDGET"


async def test_holders_wait_for_room_and_sessions_do_not_share_it() -> None:
    budget = ByteBudget(10)
    order: list[str] = []
    release = asyncio.Event()

    async def holder(key: str, n: int, name: str) -> None:
        async with budget.hold(key, n, "x"):
            order.append(name)
            await release.wait()

    first = asyncio.create_task(holder("s", 8, "first"))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(holder("s", 8, "second"))
    other = asyncio.create_task(holder("t", 8, "other session"))
    await asyncio.sleep(0.01)
    assert order == ["first", "other session"]
    assert budget.held("s") == 8
    release.set()
    await asyncio.gather(first, second, other)
    assert order == ["first", "other session", "second"]
    assert budget.held("s") == 0 and budget.held("t") == 0
    assert not budget._room and not budget._users  # nothing kept for idle sessions


def _spec(cap: int) -> ExecSpec:
    return ExecSpec(
        argv=["sleep", "1"], cwd=".", env={}, stdin=b"", timeout_s=10, max_output_bytes=cap
    )


def _reserve(procs: dict[str, BackgroundProcess], cap: int, budget: int) -> None:
    for old in process_room.for_buffers(procs, cap, budget):
        del procs[old.process_id]


async def test_background_processes_reserve_their_rings_within_the_session_budget() -> None:
    procs: dict[str, BackgroundProcess] = {}
    budget = processes.SESSION_OUTPUT_BUFFER_BYTES
    cap = 16 * MiB
    fits = budget // (2 * cap)
    for i in range(fits):
        _reserve(procs, cap, budget)
        procs[f"p{i}"] = BackgroundProcess("s", f"p{i}", _spec(cap))
    with pytest.raises(ResourceExhausted) as exc:
        _reserve(procs, cap, budget)
    assert exc.value.reason == "OUTPUT_BUFFER_BUDGET"
    # An exited process keeps only what it still holds; the oldest exit records go first.
    procs["p0"].finish(ExecExited(0, "", False, False, 0.1))
    _reserve(procs, cap, budget)
    assert "p0" in procs  # it holds nothing: no need to forget it
    procs["p0"].output[next(iter(procs["p0"].output))].append(b"z" * 100, 1, merge=False)
    _reserve(procs, cap, budget)
    assert "p0" not in procs  # its 100 bytes were in the way: its exit record went
