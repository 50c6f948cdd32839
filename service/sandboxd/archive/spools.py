"""The server-side copies of replace imports' sanitised archives: unlinked files, reused.

A replace import keeps what it sends to `tar -x` in a spool, so that an archive that does not
fit beside the content it replaces can be unpacked again once that content is gone
(transfer.py). Every replace writes its whole archive there, so the spool's cost is per byte.

Why reused rather than made per import: writing 48 MiB into a fresh file costs the filesystem's
block allocation and new page-cache pages, and the close then frees them all (about 40 ms of the
server's CPU per 48 MiB import, measured: a third of all it spends on one). Writing over the
pages of a file kept from an earlier import costs the copy alone. A few idle spools are kept,
each no larger than `keep_bytes` (a larger one is closed); they are unlinked from the start, so
nothing is left behind whatever happens to the server, and each belongs to one import at a time.
A reused file may be longer than what the current import wrote: only its own `length` bytes
are ever read back.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

from sandboxd.archive.pipe import retrieve

READ_BYTES = 256 * 1024
KEEP = 2  # idle spools kept for the next replace imports
KEEP_BYTES = 128 * 1024 * 1024  # a spool grown past this is closed, not kept (disk: KEEP x)


class Spool:
    """One import's spool: written from its start, on the import thread; read back on the loop."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.length = 0  # bytes this import wrote (the file may hold more, from an earlier one)
        # Set once the import thread that writes it has ended: a spool whose writer may still
        # run (a call cancelled twice over) is closed, never handed to another import.
        self.settled = False

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.length += len(data)

    async def read_back(self) -> AsyncIterator[bytes]:
        """What this import wrote, from the start, in chunks."""
        await asyncio.to_thread(self.file.seek, 0)
        left = self.length
        while left > 0:
            chunk = await asyncio.to_thread(self.file.read, min(READ_BYTES, left))
            if not chunk:
                raise OSError("the import spool is shorter than what was written to it")
            left -= len(chunk)
            yield chunk


class Spools:
    """Hands out spools, keeping a few idle ones (module docstring says why)."""

    def __init__(self, directory: Path, keep: int = KEEP, keep_bytes: int = KEEP_BYTES) -> None:
        self._directory = directory
        self._keep = keep
        self._keep_bytes = keep_bytes
        self._idle: list[BinaryIO] = []

    async def take(self) -> Spool:
        if self._idle:
            file = self._idle.pop()
        else:
            file = await asyncio.to_thread(self._new)
        await asyncio.to_thread(file.seek, 0)
        return Spool(file)

    def give_back(self, spool: Spool) -> None:
        """Keep the file for the next import, or close it (not awaited: freeing a large
        spool's pages takes milliseconds nobody need wait for; it is unlinked already)."""
        if (
            spool.settled
            and len(self._idle) < self._keep
            and spool.length <= self._keep_bytes
            and not spool.file.closed
        ):
            self._idle.append(spool.file)
            return
        closing = asyncio.get_running_loop().run_in_executor(None, spool.file.close)
        closing.add_done_callback(retrieve)

    def close(self) -> None:
        """Server shutdown: close the idle files (they are unlinked: nothing stays on disk)."""
        idle, self._idle = self._idle, []
        for file in idle:
            file.close()

    def _new(self) -> BinaryIO:
        self._directory.mkdir(parents=True, exist_ok=True)
        return tempfile.TemporaryFile(dir=self._directory)  # unlinked at once: no leftovers
