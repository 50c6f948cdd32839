"""AttachProcess for a background process whose output the sandbox's agent keeps (issue 13).

The server holds no ring for such a process, only a live tail per stream while it runs (what its
own reader passes on anyway, `BackgroundProcess.tail`). A reader whose cursors are within the
tail reads it, with its own cursors, as readers of a server ring do: a live follower costs no
second pass over the agent's channel. A reader further back (an old offset, or it fell behind
the tail) opens its own `attach` stream to the agent from its cursors, so replay flows with the
channel's flow control (a slow reader holds only its stream's window, and stalls nothing else),
and goes back to the tail, closing that stream, as soon as its cursors are within it again. The
exit drops the record's tail: a reader on it finishes from the tail it holds (final then), a
later or further-back one from the agent. `exited` comes from the server's record, once the last
byte was delivered.

The agent's ring has slack beyond the process's ring (for the server's own live reader), so a
reader is offered the same range as with a server ring: at most `retention` bytes back from the
end; anything older, or overwritten in the agent meanwhile, is an `OutputGap`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from sandboxd.engine.protocol import DetachedExecs
from sandboxd.errors import InvalidArgument, OutOfRange
from sandboxd.execution import GAP_FD
from sandboxd.models import ExecKeepalive, ExecOutput, ExecStarted, OutputStream
from sandboxd.process_record import AttachEvent, BackgroundProcess, OutputGap, next_output
from sandboxd.reasons import Reason

_FDS = (OutputStream.STDOUT, OutputStream.STDERR)


def _check_offsets(offsets: dict[OutputStream, int], ends: dict[OutputStream, int] | None) -> None:
    """Negative offsets (before any I/O: `ends` None), then offsets past the end."""
    for stream, offset in offsets.items():
        name = stream.name.lower()
        if offset < 0:
            raise InvalidArgument(
                f"{name}_offset must not be negative", reason=Reason.INVALID_OFFSET
            )
        if ends is not None and offset > ends[stream]:
            raise OutOfRange(
                f"{name}_offset {offset} is past the end of {name} ({ends[stream]} bytes so far)",
                reason=Reason.OFFSET_OUT_OF_RANGE,
                metadata={"stream": name, "end": str(ends[stream])},
            )


async def follow(
    detached: DetachedExecs,
    proc: BackgroundProcess,
    stdout_offset: int,
    stderr_offset: int,
    keepalive_s: float,
) -> AsyncIterator[AttachEvent]:
    """started, then output from the offsets (gaps where it is gone), live output, exited."""
    reader = _Reader(detached, proc, stdout_offset, stderr_offset, keepalive_s)
    _check_offsets(reader.cursor, None)
    first = not reader.in_tail()
    if not first:
        yield ExecStarted(proc.process_id)
    while not reader.done:
        caught_up = proc.exited is not None and reader.at_end()  # only `exited` is left
        on_tail = not first and (caught_up or reader.in_tail())
        part = reader.from_tail() if on_tail else reader.from_agent(first)
        first = False
        async for event in part:
            yield event


class _Reader:
    """One AttachProcess reader's cursors, and which copy it reads: the tail or the agent's."""

    def __init__(
        self,
        detached: DetachedExecs,
        proc: BackgroundProcess,
        stdout_offset: int,
        stderr_offset: int,
        keepalive_s: float,
    ) -> None:
        self.detached = detached
        self.proc = proc
        self.cursor = {OutputStream.STDOUT: stdout_offset, OutputStream.STDERR: stderr_offset}
        self.keepalive_s = keepalive_s
        self.done = False

    def in_tail(self) -> bool:
        tail = self.proc.tail
        return bool(tail) and all(tail[s].start <= self.cursor[s] <= tail[s].end for s in _FDS)

    def at_end(self) -> bool:
        return all(self.cursor[s] >= self.proc.end(s) for s in _FDS)

    async def _exited(self) -> AsyncIterator[AttachEvent]:
        """The record's exit (it follows the agent's at once), keepalives until then."""
        proc = self.proc
        while proc.exited is None:
            changed = proc.changed()
            try:
                await asyncio.wait_for(changed.wait(), timeout=self.keepalive_s)
            except TimeoutError:
                yield ExecKeepalive()
        self.done = True
        yield proc.exited

    async def from_tail(self) -> AsyncIterator[AttachEvent]:
        """Until the reader falls behind the tail. The exit drops the record's tail, but a
        reader on it reads on from the tail it holds (final then: nothing comes after the
        exit), rather than open an agent stream for its last bytes; it goes with that reader."""
        proc, cursor = self.proc, self.cursor
        tail = proc.tail
        while True:
            changed = proc.changed()
            if tail and any(cursor[s] < tail[s].start for s in _FDS):
                return  # fell behind the tail
            if (got := next_output(tail, cursor)) is not None:
                stream, data = got
                yield ExecOutput(stream, data, cursor[stream])
                cursor[stream] += len(data)
                continue
            if proc.exited is not None:  # all the tail held is read
                if self.at_end():
                    async for event in self._exited():
                        yield event
                return  # else the rest from the agent's copy
            try:
                await asyncio.wait_for(changed.wait(), timeout=self.keepalive_s)
            except TimeoutError:
                yield ExecKeepalive()

    async def from_agent(self, first: bool) -> AsyncIterator[AttachEvent]:
        """From the agent's ring at the cursors, until they are within the tail again (the
        stream closes then) or the exit."""
        proc, cursor = self.proc, self.cursor
        kept = proc.agent
        assert kept is not None
        offsets = {s.value: max(0, n) for s, n in cursor.items()}
        async with self.detached.attach(kept.container_id, kept.detach_id, offsets) as stream:
            if first:  # the agent's end: at least the record's (the agent wrote what we read)
                _check_offsets(cursor, {s: max(stream.end[s.value], proc.end(s)) for s in _FDS})
                yield ExecStarted(proc.process_id)
            at = dict(cursor)  # where the agent's stream is, per stream
            for s in _FDS:  # older than the process's ring offers: a gap, as with a server ring
                held = max(stream.start[s.value], stream.end[s.value] - kept.retention)
                if cursor[s] < held:
                    yield OutputGap(s, cursor[s], held - cursor[s])
                    cursor[s] = held
            reading: asyncio.Future[Any] | None = None
            try:
                while not self.in_tail():
                    reading = reading or asyncio.ensure_future(stream.read())
                    done, _ = await asyncio.wait({reading}, timeout=self.keepalive_s)
                    if not done:
                        yield ExecKeepalive()
                        continue
                    item, reading = reading.result(), None
                    if item is None:
                        break
                    for event in _advance(item, at, cursor):
                        yield event
                else:
                    return  # within the tail: read on from it
            finally:
                if reading is not None:  # the reader went away: the stream closes after it
                    reading.cancel()
                    await asyncio.wait({reading})
        async for event in self._exited():
            yield event


def _advance(
    item: tuple[int, bytes], at: dict[OutputStream, int], cursor: dict[OutputStream, int]
) -> list[AttachEvent]:
    """What one item of an agent stream at `at` gives a reader at `cursor` (both moved on)."""
    fd, data = item
    if fd - GAP_FD in (1, 2):  # the agent's ring overwrote what had not come yet
        s = OutputStream(fd - GAP_FD)
        at[s] += int.from_bytes(data, "big")
        if at[s] > cursor[s]:
            gap = OutputGap(s, cursor[s], at[s] - cursor[s])
            cursor[s] = at[s]
            return [gap]
        return []
    if fd not in (1, 2):
        return []
    s = OutputStream(fd)
    before, at[s] = at[s], at[s] + len(data)
    if at[s] <= cursor[s]:
        return []
    piece = data[cursor[s] - before :] if cursor[s] > before else data
    out = ExecOutput(s, piece, cursor[s])
    cursor[s] = at[s]
    return [out]
