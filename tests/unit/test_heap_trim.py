"""HeapTrimmer (sandboxd/heap.py): when free heap memory is given back, and that it is.

The decision is driven with a scripted probe; the effect is checked on this machine's glibc in
a fresh interpreter, where memory freed below a live block stays resident until trimmed (what
kept the server at 163 MiB after `bench/run.py --only processes`, 82 idle).
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from fresh_python import run_snippet
from sandboxd.heap import HeapTrimmer, HeapUsage

MIB = 1024 * 1024


class ScriptedHeap:
    """Resident and allocated bytes set by the test; `trim` gives back all slack above 10 MiB."""

    def __init__(self) -> None:
        self.resident = 60 * MIB
        self.allocated = 50 * MIB
        self.trims = 0

    def probe(self) -> HeapUsage:
        return HeapUsage(self.resident, self.allocated)

    def trim(self) -> None:
        self.trims += 1
        self.resident = self.allocated + 10 * MIB

    def trimmer(self) -> HeapTrimmer:
        return HeapTrimmer(self.probe, self.trim, threshold=32 * MIB)


def test_memory_freed_and_left_free_is_trimmed_once() -> None:
    heap = ScriptedHeap()
    trimmer = heap.trimmer()
    assert not trimmer.due()  # the first check sets the baseline
    heap.allocated -= 40 * MIB  # a burst's buffers freed, their pages still resident
    assert not trimmer.due()  # seen once: it may be reused at once
    assert trimmer.due()  # still free at the next check
    trimmer.trim()
    assert heap.trims == 1
    assert heap.resident == 20 * MIB
    assert not any(trimmer.due() for _ in range(5))  # the same memory is not trimmed again


def test_memory_reused_before_the_next_check_is_kept() -> None:
    heap = ScriptedHeap()
    trimmer = heap.trimmer()
    trimmer.due()
    for _ in range(5):  # a busy server: freed, then used again by the next call
        heap.allocated -= 40 * MIB
        assert not trimmer.due()
        heap.allocated += 40 * MIB
        assert not trimmer.due()


def test_small_frees_are_left_to_malloc() -> None:
    heap = ScriptedHeap()
    trimmer = heap.trimmer()
    trimmer.due()
    heap.allocated -= 31 * MIB
    assert not any(trimmer.due() for _ in range(5))


def test_growth_in_use_moves_the_baseline_down_not_up() -> None:
    """Slack that is reused lowers the baseline, so a later free of the same size counts."""
    heap = ScriptedHeap()
    trimmer = heap.trimmer()
    heap.allocated -= 40 * MIB  # freed before the first check: the baseline includes it
    assert not trimmer.due()
    heap.allocated += 40 * MIB  # reused: slack back down
    assert not trimmer.due()
    heap.allocated -= 40 * MIB  # freed again
    assert not trimmer.due()
    assert trimmer.due()


async def test_run_trims_off_the_loop_after_a_burst() -> None:
    heap = ScriptedHeap()
    threads: list[threading.Thread] = []
    original = heap.trim

    def trim() -> None:
        threads.append(threading.current_thread())
        original()

    trimmer = HeapTrimmer(heap.probe, trim, threshold=32 * MIB)
    task = asyncio.create_task(trimmer.run(0.01))
    await asyncio.sleep(0.03)
    heap.allocated -= 40 * MIB
    for _ in range(100):
        await asyncio.sleep(0.01)
        if heap.trims:
            break
    task.cancel()
    assert heap.trims == 1
    assert threads[0] is not threading.main_thread()


_FRAGMENT = """
import json
from sandboxd.heap import HeapTrimmer, tune_malloc

tune_malloc()  # as the server starts: 64 KiB blocks come from the heap
trimmer = HeapTrimmer.for_this_process()
assert trimmer is not None
trimmer.due()
# 80 MiB of output-ring-sized chunks, each followed by a small block that outlives them
chunks, pins = [], []
for _ in range(1280):
    chunks.append(bytearray(64 * 1024))
    pins.append(bytes(600))
del chunks
freed = trimmer._probe()
checks = [trimmer.due(), trimmer.due()]
if checks[-1]:
    trimmer.trim()
print(json.dumps({"freed": freed.resident, "after": trimmer._probe().resident,
                  "checks": checks}))
"""


@pytest.mark.skipif(HeapTrimmer.for_this_process() is None, reason="needs glibc's malloc")
def test_freed_heap_memory_below_a_live_block_is_given_back() -> None:
    out = run_snippet(_FRAGMENT).stdout
    result = json.loads(out)
    assert result["checks"] == [False, True]
    # freed but resident: what malloc alone keeps (the small blocks pin the heap's top)...
    assert result["freed"] > 80 * MIB
    # ...and given back by the trim
    assert result["freed"] - result["after"] > 64 * MIB


_THREADS = """
import ctypes, threading
from sandboxd.heap import tune_malloc

tune_malloc()  # as `main` does, before any thread starts
barrier = threading.Barrier(8)


def work() -> None:
    blocks = [bytearray(200_000) for _ in range(20)]  # each thread allocates while all live
    barrier.wait()
    del blocks


threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" line per arena, on stderr
"""


@pytest.mark.skipif(HeapTrimmer.for_this_process() is None, reason="needs glibc's malloc")
def test_threads_share_a_bounded_number_of_arenas() -> None:
    """Eight allocating threads would get eight arenas of their own, each keeping free memory."""
    stats = run_snippet(_THREADS).stderr
    arenas = [line for line in stats.splitlines() if line.startswith("Arena ")]
    assert 1 <= len(arenas) <= 2, stats
