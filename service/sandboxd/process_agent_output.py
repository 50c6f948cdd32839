"""AttachProcess for a background process whose output the sandbox's agent keeps (issue 13).

The server holds no ring for such a process: each reader opens its own `attach` stream to the
agent from the offsets it asked for, so replay and live output flow through with the channel's
flow control (a slow reader holds only its stream's window, and stalls nothing else), and the
output is counted against the sandbox's memory, never the server's. `exited` comes from the
server's record, once the agent's stream has delivered the last byte.

The agent's ring has slack beyond the process's ring (for the server's own live reader), so a
reader is offered the same range as with a server ring: at most `retention` bytes back from the
end; anything older, or overwritten in the agent meanwhile, is an `OutputGap`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from sandboxd.engine.protocol import DetachedExecs
from sandboxd.errors import InvalidArgument, OutOfRange
from sandboxd.execution import GAP_FD
from sandboxd.models import ExecKeepalive, ExecOutput, ExecStarted, OutputStream
from sandboxd.process_record import AttachEvent, BackgroundProcess, OutputGap
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
    kept = proc.agent
    assert kept is not None
    cursor = {OutputStream.STDOUT: stdout_offset, OutputStream.STDERR: stderr_offset}
    _check_offsets(cursor, None)
    offsets = {s.value: max(0, n) for s, n in cursor.items()}
    async with detached.attach(kept.container_id, kept.detach_id, offsets) as stream:
        # The agent's end: at least the record's, since the agent wrote what the server read.
        _check_offsets(cursor, {s: max(stream.end[s.value], proc.end(s)) for s in _FDS})
        yield ExecStarted(proc.process_id)
        at = dict(cursor)  # where the agent's stream is, per stream
        for s in _FDS:  # older than the process's ring offers: a gap, as with a server ring
            held = max(stream.start[s.value], stream.end[s.value] - kept.retention)
            if cursor[s] < held:
                yield OutputGap(s, cursor[s], held - cursor[s])
                cursor[s] = held
        reading: asyncio.Task[tuple[int, bytes] | None] | None = None
        try:
            while True:
                reading = reading or asyncio.ensure_future(stream.read())
                done, _ = await asyncio.wait({reading}, timeout=keepalive_s)
                if not done:
                    yield ExecKeepalive()
                    continue
                item, reading = reading.result(), None
                if item is None:
                    break
                fd, data = item
                if fd - GAP_FD in (1, 2):  # the agent's ring overwrote what had not come yet
                    s = OutputStream(fd - GAP_FD)
                    at[s] += int.from_bytes(data, "big")
                    if at[s] > cursor[s]:
                        yield OutputGap(s, cursor[s], at[s] - cursor[s])
                        cursor[s] = at[s]
                    continue
                if fd not in (1, 2):
                    continue
                s = OutputStream(fd)
                before, at[s] = at[s], at[s] + len(data)
                if at[s] > cursor[s]:
                    piece = data[cursor[s] - before :] if cursor[s] > before else data
                    yield ExecOutput(s, piece, cursor[s])
                    cursor[s] = at[s]
        finally:
            if reading is not None:  # the reader went away: the stream closes after it
                reading.cancel()
                await asyncio.wait({reading})
    while proc.exited is None:  # the record's exit follows the agent's at once
        changed = proc.changed()
        try:
            await asyncio.wait_for(changed.wait(), timeout=keepalive_s)
        except TimeoutError:
            yield ExecKeepalive()
    yield proc.exited
