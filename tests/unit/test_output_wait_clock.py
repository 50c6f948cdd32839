"""A command's reads for output under one clock (sandboxd.wait_clock, Command.events): a quiet
command still gets a keepalive after each quiet `keepalive_s`, its deadline still ends it, a bad
control message (`Command.fail`) still wakes the waiting reader at once, output that keeps
coming is never cut however long the stream runs, and a cancellation of the task that reads is
still a cancellation."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sandboxd.errors import InvalidArgument
from sandboxd.execution import Command
from sandboxd.models import ExecExited, ExecKeepalive, ExecOutput, ExecSpec, ExecStarted
from sandboxd.wait_clock import WaitClock


class _Stream:
    """An ExecStream fed by the test: `put` a chunk (None: the end), `read` waits for one."""

    exec_id = "exec-1"

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()

    async def read(self) -> tuple[int, bytes] | None:
        return await self.queue.get()

    async def wait_exit_code(self) -> int:
        return 0


class _Executor:
    def __init__(self) -> None:
        self.killed = 0

    async def kill(self, session: Any, token: str, exec_id: str) -> None:
        self.killed += 1


def _command(stream: _Stream, executor: _Executor, timeout_s: float = 60.0) -> Command:
    spec = ExecSpec(["cat"], "/", {}, b"", timeout_s, 1 << 20)
    return Command(executor, None, spec, "p1", "t1", stream, tty=False)  # type: ignore[arg-type]


async def test_a_quiet_command_gets_a_keepalive_per_quiet_period_then_its_output() -> None:
    stream, executor = _Stream(), _Executor()
    events = _command(stream, executor).events(keepalive_s=0.05)
    assert isinstance(await anext(events), ExecStarted)
    began = time.monotonic()
    assert isinstance(await asyncio.wait_for(anext(events), 5), ExecKeepalive)
    assert isinstance(await asyncio.wait_for(anext(events), 5), ExecKeepalive)
    # Two quiet periods, not two timers at once; and each keepalive on time, though every read
    # here runs in a task of its own (3.11's wait_for), not the task that made the clock.
    assert 0.09 <= time.monotonic() - began < 3
    stream.queue.put_nowait((1, b"x"))
    out = await asyncio.wait_for(anext(events), 5)
    assert isinstance(out, ExecOutput) and out.data == b"x" and out.offset == 0
    stream.queue.put_nowait(None)
    exited = await asyncio.wait_for(anext(events), 5)
    assert isinstance(exited, ExecExited) and exited.exit_code == 0 and not exited.timed_out
    await events.aclose()


async def test_output_that_keeps_coming_is_never_cut_nor_interleaved_with_keepalives() -> None:
    stream, executor = _Stream(), _Executor()
    events = _command(stream, executor).events(keepalive_s=0.4)
    assert isinstance(await anext(events), ExecStarted)

    async def feed() -> None:
        # Each well under the keepalive period (a loaded host's late wake-ups fit in the
        # margin); the stream over it.
        for _ in range(12):
            await asyncio.sleep(0.04)
            stream.queue.put_nowait((1, b"y"))
        stream.queue.put_nowait(None)

    feeder = asyncio.create_task(feed())
    got = [event async for event in events]
    await feeder
    assert [type(e) for e in got] == [ExecOutput] * 12 + [ExecExited]
    assert [e.offset for e in got[:-1]] == list(range(12))  # type: ignore[union-attr]


async def test_the_deadline_still_ends_a_quiet_command_as_timed_out() -> None:
    stream, executor = _Stream(), _Executor()
    events = _command(stream, executor, timeout_s=0.1).events(keepalive_s=30)
    got = await asyncio.wait_for(_all(events), 5)
    assert isinstance(got[0], ExecStarted)
    assert isinstance(got[-1], ExecExited) and got[-1].timed_out and got[-1].exit_code == 137
    assert not any(isinstance(e, ExecKeepalive) for e in got)
    assert executor.killed == 1


async def test_the_deadline_holds_without_keepalives_too() -> None:
    stream, executor = _Stream(), _Executor()
    got = await asyncio.wait_for(_all(_command(stream, executor, 0.1).events()), 5)
    assert isinstance(got[-1], ExecExited) and got[-1].timed_out


async def test_fail_wakes_the_waiting_reader_at_once() -> None:
    stream, executor = _Stream(), _Executor()
    command = _command(stream, executor)
    events = command.events(keepalive_s=30)
    assert isinstance(await anext(events), ExecStarted)
    waiting = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.02)
    assert not waiting.done()
    command.fail(InvalidArgument("a bad control message"))
    with pytest.raises(InvalidArgument):
        await asyncio.wait_for(waiting, 1)
    assert stream.queue.empty()


async def test_a_cancelled_reader_is_still_cancelled() -> None:
    stream, executor = _Stream(), _Executor()

    async def read_all() -> None:
        async for _ in _command(stream, executor).events(keepalive_s=0.05):
            pass

    task = asyncio.create_task(read_all())
    await asyncio.sleep(0.12)  # past two keepalives: the clock has fired and set itself again
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_clock_cancels_only_a_wait_and_lapses_between_waits() -> None:
    clock = WaitClock(0.3)
    clock.begin()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.sleep(5)
    assert clock.expired()
    clock.end()
    # Between waits the timer lapses: work of the task longer than `idle` is never cut.
    await asyncio.sleep(0.7)
    clock.begin()
    await asyncio.sleep(0.01)  # a wait well under `idle` ends by itself
    clock.end()
    assert clock.handle is not None  # set again by the wait, for `idle` after it began
    clock.stop()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def _all(events: Any) -> list[Any]:
    return [event async for event in events]
