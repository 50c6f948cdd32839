"""Lines logged on the loop are written once per loop pass, in the order they were logged,
with a line from another thread never overtaking those waiting, and nothing left unwritten by
a flush (logging's shutdown at exit)."""

from __future__ import annotations

import asyncio
import io
import logging
import threading

from sandboxd.logging_setup import BatchingHandler


class _Counting(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


def _logger(stream: _Counting) -> tuple[logging.Logger, BatchingHandler]:
    handler = BatchingHandler(stream)
    log = logging.getLogger(f"test-batching-{id(stream)}")
    log.propagate = False
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return log, handler


async def test_one_write_per_loop_pass_in_order() -> None:
    stream = _Counting()
    log, _ = _logger(stream)
    for i in range(50):
        log.info("line %d", i)
    assert stream.getvalue() == ""  # not yet: the pass is still running
    await asyncio.sleep(0)
    assert stream.getvalue().splitlines() == [f"line {i}" for i in range(50)]
    assert stream.writes == 1


async def test_another_threads_line_comes_after_the_waiting_ones() -> None:
    stream = _Counting()
    log, _ = _logger(stream)
    log.info("first, on the loop")
    worker = threading.Thread(target=log.info, args=("second, from a thread",))
    worker.start()
    worker.join()
    log.info("third, on the loop")
    await asyncio.sleep(0)
    assert stream.getvalue().splitlines() == [
        "first, on the loop",
        "second, from a thread",
        "third, on the loop",
    ]


async def test_bounded_and_flushed() -> None:
    stream = _Counting()
    log, handler = _logger(stream)
    for i in range(BatchingHandler.MAX_LINES):
        log.info("%d", i)
    assert len(stream.getvalue().splitlines()) == BatchingHandler.MAX_LINES  # written at the cap
    log.info("waiting")
    handler.flush()  # what logging.shutdown does at exit
    assert stream.getvalue().splitlines()[-1] == "waiting"


def test_without_a_loop_each_line_goes_at_once() -> None:
    stream = _Counting()
    log, _ = _logger(stream)
    log.info("now")
    assert stream.getvalue() == "now\n"


def test_a_loop_that_ended_with_lines_waiting_does_not_hold_the_next_loops() -> None:
    stream = _Counting()
    log, _ = _logger(stream)

    async def log_and_leave() -> None:
        asyncio.get_running_loop().stop()  # this pass is its last: the flush never runs
        log.info("from the first loop")

    loop = asyncio.new_event_loop()
    loop.run_until_complete(log_and_leave())
    loop.close()

    async def log_and_yield() -> None:
        log.info("from the second loop")
        await asyncio.sleep(0)

    asyncio.run(log_and_yield())
    assert stream.getvalue().splitlines() == ["from the first loop", "from the second loop"]
