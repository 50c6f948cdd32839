"""The C heap (glibc malloc) of the server process: tuned at start-up, trimmed after bursts.

Streamed messages, archive chunks and background processes' output rings are Python objects
of 64-256 KiB, served from glibc's heap (`tune_malloc`). Memory freed in the middle of the
heap is not returned to the system while a live block sits above it: after one session's
background processes held their 64 MiB of retained output and ended, the server kept 80 MiB
more RSS than it used, for good (`bench/run.py`: 163 MiB after `--only processes` against 82
idle; live malloc memory 14 MiB). `malloc_trim` gives the free pages back wherever they are,
so `HeapTrimmer` calls it when that much has stayed free and resident for a while: never in
the middle of a burst that reuses it (the pages would be faulted in again), and never twice
for the same memory.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

TRIM_SLACK_BYTES = 32 * 1024 * 1024  # free but resident heap memory worth giving back
TRIM_CHECK_INTERVAL_S = 0.5  # trimmed once it stayed free over two checks in a row
MMAP_THRESHOLD = 4 * 1024 * 1024  # blocks under this come from the heap, not a fresh mmap
TRIM_THRESHOLD = 8 * 1024 * 1024  # free memory a heap keeps at its top before shrinking
ARENA_MAX = 2  # malloc arenas shared by all threads (glibc's own limit: 8 per core)


def tune_malloc() -> None:
    """Keep the 64-256 KiB buffers of streamed messages on the heap, in two arenas (glibc).

    glibc serves blocks over its mmap threshold (128 KiB, then adjusted as blocks are freed)
    with a fresh mmap each time, so every archive or output chunk page-faulted its memory
    in anew: some 12 000 faults and a quarter of the server's CPU per 48 MiB export. Blocks
    under 4 MiB now come from the heap (an archive's 1 MiB messages and the joins and copies
    of them a little over 1 MiB among them), which keeps up to 8 MiB free before giving
    memory back (and `HeapTrimmer` returns what a burst left in the middle of it).

    Each thread that allocates (gRPC's, the audit's SHA-256 and the archive checks on the
    default executor) otherwise gets an arena of its own, up to 8 per core, each keeping up
    to that 4 MiB free (the threshold then) at its top where no trim reaches: 15 arenas held
    17 MiB, 1 MiB of it in use, after `bench/run.py --only core,processes,archive`. All
    threads now share two (they allocate little, and mostly under the GIL, so they seldom
    wait for each other).

    Settings given in the environment (MALLOC_*_, MALLOC_ARENA_MAX) are left alone; called
    first thing in `main`, before the threads start; elsewhere a no-op.
    """
    libc = _glibc()
    if libc is None:
        return
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
    if not any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        libc.mallopt(m_mmap_threshold, MMAP_THRESHOLD)
        libc.mallopt(m_trim_threshold, TRIM_THRESHOLD)
    if "MALLOC_ARENA_MAX" not in os.environ:
        libc.mallopt(m_arena_max, ARENA_MAX)


@dataclass(frozen=True)
class HeapUsage:
    """Bytes the process has resident (anonymous memory) and bytes malloc has handed out."""

    resident: int
    allocated: int

    @property
    def slack(self) -> int:
        """Resident memory no live malloc block accounts for: free heap pages kept, plus the
        interpreter's own arenas and thread stacks (steady, so only its growth counts)."""
        return self.resident - self.allocated


class HeapTrimmer:
    """Calls `trim` once free heap memory of at least `threshold` bytes has stayed resident
    over two checks in a row, then measures again from there.

    `probe` and `trim` are the process's (`for_this_process`); tests pass their own to
    drive the decision.
    """

    def __init__(
        self,
        probe: Callable[[], HeapUsage],
        trim: Callable[[], object],
        threshold: int = TRIM_SLACK_BYTES,
    ) -> None:
        self._probe = probe
        self._trim = trim
        self._threshold = threshold
        self._baseline: int | None = None  # the lowest slack since the last trim
        self._over = False  # the previous check already saw enough to give back

    @classmethod
    def for_this_process(cls) -> HeapTrimmer | None:
        """None where the C library is not glibc (nothing to trim, or no way to measure)."""
        libc = _glibc()
        if libc is None or not hasattr(libc, "mallinfo2") or not hasattr(libc, "malloc_trim"):
            return None
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]

        def probe() -> HeapUsage:
            info = libc.mallinfo2()
            return HeapUsage(_resident_anon_bytes(), info.uordblks + info.hblkhd)

        return cls(probe, lambda: libc.malloc_trim(0))

    def due(self) -> bool:
        """One check: whether to trim now (the slack stayed over the threshold since the last
        check). A drop in slack (the memory was reused) lowers the baseline."""
        slack = self._probe().slack
        if self._baseline is None or slack < self._baseline:
            self._baseline = slack
        over = slack - self._baseline >= self._threshold
        due, self._over = over and self._over, over
        return due

    def trim(self) -> None:
        """Gives free heap pages back (blocking: the caller runs it off the event loop)."""
        before = self._probe()
        self._trim()
        after = self._probe()
        self._baseline, self._over = after.slack, False
        log.debug(
            "heap trimmed: resident %.1f -> %.1f MiB",
            before.resident / 2**20,
            after.resident / 2**20,
        )

    async def run(self, interval_s: float = TRIM_CHECK_INTERVAL_S) -> None:
        """Checks every `interval_s` until cancelled; a trim runs on a thread (it walks the
        heap and may take tens of milliseconds)."""
        while True:
            await asyncio.sleep(interval_s)
            if self.due():
                await asyncio.to_thread(self.trim)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt  # noqa: B018 - glibc and musl have it; absent elsewhere
    except (OSError, AttributeError):
        return None
    return libc


def _resident_anon_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0
