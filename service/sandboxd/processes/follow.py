"""AttachProcess for a background process whose output the sandbox's agent keeps.

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

from sandboxd.commands import DetachedExecs
from sandboxd.errors import Internal, InvalidArgument, OutOfRange
from sandboxd.execution import GAP_FD
from sandboxd.models import ExecKeepalive, ExecOutput, ExecStarted, OutputStream
from sandboxd.processes.record import AttachEvent, BackgroundProcess, OutputGap, next_output
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
    """started, then output from the offsets (gaps where it is gone), live output, exited.

    `exited` comes only once the reader has all of the output: up to the record's end where
    the server's own reader saw all of it (`output_complete`), else up to the end of the
    agent's copy (its stream's EXIT), never at a short end."""
    reader = _Reader(detached, proc, stdout_offset, stderr_offset, keepalive_s)
    _check_offsets(reader.cursor, None)
    proc.followers += 1  # its agent copy is not forgotten under it for room (processes/budget.py)
    try:
        async for event in _follow(reader):
            yield event
    finally:
        proc.followers -= 1


async def _follow(reader: _Reader) -> AsyncIterator[AttachEvent]:
    proc = reader.proc
    first = not reader.in_tail()
    if not first:
        yield ExecStarted(proc.process_id)
    short = 0  # times the agent's stream ended before the record's end
    while first or not reader.finished():  # first: the agent checks the offsets, says started
        if reader.agent_ended:  # the agent's copy ended: the process has, or is ending
            async for event in reader.until_exit():
                yield event
            if reader.finished():
                break
            short += 1  # the agent's stream ended short of what the server saw: once more
            if short > MAX_SHORT_ENDS:
                raise _short_end(proc, reader.cursor)
            reader.agent_ended = False
        on_tail = not first and reader.in_tail()
        part = reader.from_tail() if on_tail else reader.from_agent(first)
        first = False
        async for event in part:
            yield event
    assert proc.exited is not None
    yield proc.exited


# An agent stream that ends (EXIT) before the bytes the server's own reader got is a broken
# agent: the reader attaches again from where it is this often, then fails loudly.
MAX_SHORT_ENDS = 2


def _short_end(proc: BackgroundProcess, cursor: dict[OutputStream, int]) -> Internal:
    ends = {s.name.lower(): (cursor[s], proc.end(s)) for s in _FDS}
    return Internal(
        f"the agent's copy of process {proc.process_id!r}'s output ended before what the "
        f"server saw (read, seen): {ends}",
        reason=Reason.AGENT_PROTOCOL_ERROR,
        metadata={"process_id": proc.process_id},
    )


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
        self.agent_ended = False  # the last agent stream ended (EXIT): its copy's end

    def in_tail(self) -> bool:
        tail = self.proc.tail
        return bool(tail) and all(tail[s].start <= self.cursor[s] <= tail[s].end for s in _FDS)

    def at_end(self) -> bool:
        return all(self.cursor[s] >= self.proc.end(s) for s in _FDS)

    def finished(self) -> bool:
        """The process has exited and this reader has all of its output. The record's end is
        the end only when the server's reader saw the whole output; when it did not (it failed
        or was cancelled: its end is short), only the agent's EXIT tells."""
        proc = self.proc
        if proc.exited is None or not self.at_end():
            return False
        return proc.output_complete or self.agent_ended

    def limits(self) -> dict[OutputStream, int] | None:
        """How far a reader of the agent's copy may go: the record's end once it is final (a
        capped or timed-out process's output past its cut is not output)."""
        proc = self.proc
        if proc.exited is None or not proc.output_complete:
            return None
        return {s: proc.end(s) for s in _FDS}

    async def until_exit(self) -> AsyncIterator[AttachEvent]:
        """Keepalives until the record's exit (it follows the agent's at once)."""
        proc = self.proc
        while proc.exited is None:
            changed = proc.changed()
            try:
                await asyncio.wait_for(changed.wait(), timeout=self.keepalive_s)
            except TimeoutError:
                yield ExecKeepalive()

    async def from_tail(self) -> AsyncIterator[AttachEvent]:
        """Until the reader falls behind the tail, or has read all the tail held at the exit.
        The exit drops the record's tail, but a reader on it reads on from the tail it holds
        (final then: nothing comes after the exit); it goes with that reader."""
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
            if proc.exited is not None:
                return  # all the tail held is read: the end, or the rest from the agent
            try:
                await asyncio.wait_for(changed.wait(), timeout=self.keepalive_s)
            except TimeoutError:
                yield ExecKeepalive()

    async def from_agent(self, first: bool) -> AsyncIterator[AttachEvent]:
        """From the agent's ring at the cursors, until they are within the tail again (the
        stream closes then), the reader has all of the output, or the agent's stream ends
        (`agent_ended`)."""
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
                while not self.in_tail() and not self.finished():
                    reading = reading or asyncio.ensure_future(stream.read())
                    done, _ = await asyncio.wait({reading}, timeout=self.keepalive_s)
                    if not done:
                        yield ExecKeepalive()
                        continue
                    item, reading = reading.result(), None
                    if item is None:
                        self.agent_ended = True
                        return
                    for event in _advance(item, at, cursor, self.limits()):
                        yield event
            finally:
                if reading is not None:  # the reader went away: the stream closes after it
                    reading.cancel()
                    await asyncio.wait({reading})


def _advance(
    item: tuple[int, bytes],
    at: dict[OutputStream, int],
    cursor: dict[OutputStream, int],
    limits: dict[OutputStream, int] | None = None,
) -> list[AttachEvent]:
    """What one item of an agent stream at `at` gives a reader at `cursor` (both moved on),
    nothing past `limits` (the record's final end)."""
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
    end = at[s] if limits is None else min(at[s], limits[s])
    if end <= cursor[s]:
        return []
    piece = data[max(0, cursor[s] - before) : end - before]
    out = ExecOutput(s, piece, cursor[s])
    cursor[s] = end
    return [out]
