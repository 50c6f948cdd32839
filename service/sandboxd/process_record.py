"""A process's record: its spec, how it is kept, its output rings, and, once ended, its exit.

Readers (`follow`) do not get pushed copies of the output: each keeps its own cursor per stream
and reads the shared buffers when woken, so a slow or dead reader holds nothing and stalls
nothing; one that fell behind the buffer is told exactly which range it lost (`OutputGap`).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from sandboxd.errors import InvalidArgument, OutOfRange
from sandboxd.execution import Command, new_token
from sandboxd.models import (
    ExecExited,
    ExecKeepalive,
    ExecOutput,
    ExecSpec,
    ExecStarted,
    OutputStream,
)
from sandboxd.output_ring import OutputBuffer
from sandboxd.reasons import Reason


class ProcessOrigin(enum.Enum):
    """Which call started a process (values as the proto's ProcessOrigin)."""

    START_PROCESS = 1
    EXEC = 2
    RUN = 3
    INTERACT = 4


@dataclass(frozen=True)
class StartOptions:
    """How StartProcess keeps a process: its ring buffer size per stream, whether output past
    `spec.max_output_bytes` is cut (and the process killed), and whether stdin stays open."""

    buffer_bytes: int
    cap_output: bool = False
    keep_stdin_open: bool = False


@dataclass(frozen=True)
class OutputGap:
    """Bytes [offset, offset+length) of `stream` left the buffer before this reader got them."""

    stream: OutputStream
    offset: int
    length: int


AttachEvent = ExecStarted | ExecOutput | ExecExited | ExecKeepalive | OutputGap


class BackgroundProcess:
    """One StartProcess process: its spec, output buffers and, once ended, its exit record."""

    def __init__(
        self,
        session_id: str,
        process_id: str,
        spec: ExecSpec,
        options: StartOptions | None = None,
        origin: ProcessOrigin = ProcessOrigin.START_PROCESS,
        token: str = "",
    ) -> None:
        self.session_id = session_id
        self.process_id = process_id
        self.spec = spec
        self.options = options or StartOptions(spec.max_output_bytes)
        self.origin = origin
        self.token = token or new_token()
        self.started_at = datetime.now(tz=UTC)
        self.output = {s: OutputBuffer(self.options.buffer_bytes) for s in OutputStream}
        # The running command while its stdin takes SendProcessInput (keep_stdin_open).
        self.command: Command | None = None
        self.stdin_lock = asyncio.Lock()  # the first `stdin` goes before any later input
        self.exited: ExecExited | None = None
        self.running: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None
        self._seq = 0
        self._last: OutputStream | None = None
        self._changed = asyncio.Event()

    def _notify(self) -> None:
        # Readers hold the event they saw before looking; setting it wakes them all at once.
        self._changed.set()
        self._changed = asyncio.Event()

    def append(self, stream: OutputStream, data: bytes) -> None:
        self._seq += 1
        self.output[stream].append(data, self._seq, merge=self._last is stream)
        self._last = stream
        self._notify()

    def append_at(self, stream: OutputStream, offset: int, data: bytes) -> None:
        """`append`, after skipping to `offset` (a range lost on the way: detached commands)."""
        buf = self.output[stream]
        if offset > buf.end:
            buf.skip(offset - buf.end)
            self._notify()
        if data:
            self.append(stream, data)

    def retained_bytes(self) -> int:
        return sum(b.end - b.start for b in self.output.values())

    def finish(self, exited: ExecExited) -> None:
        if self.exited is None:
            self.exited = exited
            self._notify()

    async def follow(
        self, stdout_offset: int, stderr_offset: int, keepalive_s: float
    ) -> AsyncIterator[AttachEvent]:
        """started, then output from the offsets (gaps where it is gone), live output, exited."""
        cursors = {OutputStream.STDOUT: stdout_offset, OutputStream.STDERR: stderr_offset}
        for stream, offset in cursors.items():
            name = stream.name.lower()
            if offset < 0:
                raise InvalidArgument(
                    f"{name}_offset must not be negative", reason=Reason.INVALID_OFFSET
                )
            if offset > self.output[stream].end:
                raise OutOfRange(
                    f"{name}_offset {offset} is past the end of {name} "
                    f"({self.output[stream].end} bytes so far)",
                    reason=Reason.OFFSET_OUT_OF_RANGE,
                    metadata={"stream": name, "end": str(self.output[stream].end)},
                )
        yield ExecStarted(self.process_id)
        while True:
            changed = self._changed
            lost = [(s, b.start) for s, b in self.output.items() if cursors[s] < b.start]
            if lost:
                stream, start = lost[0]
                # Move the cursor before yielding: the buffer may move on while we wait.
                offset, cursors[stream] = cursors[stream], start
                yield OutputGap(stream, offset, start - offset)
                continue  # look again: more may have gone meanwhile
            best: tuple[int, OutputStream, bytes] | None = None
            for stream, buffer in self.output.items():
                got = buffer.read(cursors[stream])
                if got is not None and (best is None or got[0] < best[0]):
                    best = (got[0], stream, got[1])
            if best is not None:
                _, stream, data = best
                yield ExecOutput(stream, data, cursors[stream])
                cursors[stream] += len(data)
                continue
            if self.exited is not None:
                yield self.exited
                return
            try:
                await asyncio.wait_for(changed.wait(), timeout=keepalive_s)
            except TimeoutError:
                yield ExecKeepalive()
