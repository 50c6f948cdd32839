"""The bounded output buffer of a process stream, addressed by absolute byte offset.

Background processes keep one per stream so a late reader can replay by offset
(processes/manager.py); memory per process is capped by the capacity and by the chunk count.
"""

from __future__ import annotations

import bisect

from sandboxd.execution import CHUNK_BYTES

MERGE_BYTES = CHUNK_BYTES  # consecutive writes of one stream share a chunk (grown in place)...
MAX_CHUNKS = 8192  # ...and the chunk count is bounded too, so tiny writes cannot bloat memory


class OutputBuffer:
    """The last `capacity` bytes of one stream, addressed by absolute offset.

    Chunks keep the global sequence number of their first write so a reader can replay
    stdout and stderr in the order they were produced.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.start = 0  # offset of the oldest retained byte
        self.end = 0  # bytes produced so far
        self._offsets: list[int] = []
        self._data: list[bytearray] = []
        self._seqs: list[int] = []
        self._head = 0  # chunks before it were dropped (compacted now and then)

    def append(self, data: bytes, seq: int, merge: bool) -> None:
        if (
            merge
            and len(self._data) > self._head
            and len(self._data[-1]) + len(data) <= MERGE_BYTES
        ):
            self._data[-1] += data
        else:
            self._offsets.append(self.end)
            self._data.append(bytearray(data))
            self._seqs.append(seq)
        self.end += len(data)
        self._trim()

    def skip(self, length: int) -> None:
        """`length` bytes were produced but lost before they reached us (the agent's ring of a
        detached process overran): the offsets move on, and what is held goes with them, so
        every reader behind is told of one gap up to the new end."""
        self.end += length
        self.start = self.end
        self._head = len(self._data)
        self._trim()

    def _trim(self) -> None:
        while self.end - self.start > self.capacity or len(self._data) - self._head > MAX_CHUNKS:
            first_end = self._offsets[self._head] + len(self._data[self._head])
            if self.end - first_end >= self.capacity or len(self._data) - self._head > MAX_CHUNKS:
                self.start = first_end
                self._data[self._head] = bytearray()
                self._head += 1
            else:  # cut the first chunk: keep exactly `capacity` bytes
                self.start = self.end - self.capacity
                del self._data[self._head][: self.start - self._offsets[self._head]]
                self._offsets[self._head] = self.start
        if self._head > 64 and self._head * 2 > len(self._data):
            del self._offsets[: self._head], self._data[: self._head], self._seqs[: self._head]
            self._head = 0

    def read(self, offset: int) -> tuple[int, bytes] | None:
        """(seq, bytes from `offset` to the end of its chunk); None at the end.

        `offset` must be at least `start` (the caller reports a gap otherwise).
        """
        if offset >= self.end:
            return None
        i = bisect.bisect_right(self._offsets, offset, lo=self._head) - 1
        skip = offset - self._offsets[i]
        with memoryview(self._data[i]) as view:  # released at once: the chunk may grow
            return self._seqs[i], bytes(view[skip : skip + CHUNK_BYTES])
