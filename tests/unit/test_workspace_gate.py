"""The per-session workspace gate (sessions/gate.py): a snapshot sees no file call half-way."""

from __future__ import annotations

import asyncio

from sandboxd.sessions.gate import WorkspaceGate


async def test_exclusive_waits_for_shared_and_blocks_new_shared() -> None:
    gate = WorkspaceGate()
    order: list[str] = []
    release = asyncio.Event()

    async def writer_call() -> None:  # a WriteFile
        async with gate.shared("s"):
            order.append("write start")
            await release.wait()
            order.append("write end")

    async def snapshot() -> None:
        async with gate.exclusive("s"):
            order.append("snapshot")

    async def late_write() -> None:
        async with gate.shared("s"):
            order.append("late write")

    first = asyncio.create_task(writer_call())
    await asyncio.sleep(0)
    snap = asyncio.create_task(snapshot())
    await asyncio.sleep(0.01)
    late = asyncio.create_task(late_write())
    await asyncio.sleep(0.01)
    assert order == ["write start"]  # the snapshot waits; the late write waits behind it
    release.set()
    await asyncio.gather(first, snap, late)
    assert order == ["write start", "write end", "snapshot", "late write"]
    assert gate._entries == {}  # nothing kept for an idle session


async def test_a_cancelled_waiter_leaves_nothing_behind() -> None:
    gate = WorkspaceGate()
    hold = asyncio.Event()

    async def reader() -> None:
        async with gate.shared("s"):
            await hold.wait()

    r = asyncio.create_task(reader())
    await asyncio.sleep(0)
    waiting = asyncio.create_task(gate.exclusive("s").__aenter__())
    await asyncio.sleep(0.01)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    # The cancelled snapshot no longer holds back new shared calls.
    async with asyncio.timeout(1):
        async with gate.shared("s"):
            pass
    hold.set()
    await r
    assert gate._entries == {}
