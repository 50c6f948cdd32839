"""A process's record: its spec, how it is kept, its output rings, and, once ended, its exit.

Readers (`follow`) do not get pushed copies of the output: each keeps its own cursor per stream
and reads the shared buffers when woken, so a slow or dead reader holds nothing and stalls
nothing; one that fell behind the buffer is told exactly which range it lost (`OutputGap`).

A background process whose sandbox has the agent keeps no ring here (`AgentKept`): its output
stays in the agent's ring, in the sandbox's memory, and the record holds how far each stream got
and, while the process runs, a small live `tail` of what the server's own reader passes on
anyway; readers within the tail read it, others attach to the agent (processes/follow.py).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from sandboxd.errors import FailedPrecondition, InvalidArgument, OutOfRange
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


# The live tail per stream of a process the agent keeps (at most its ring size): what the server's
# own reader passes on anyway, so a follower within it reads from the server and live output
# crosses the agent's channel once, not once more per follower. The server's reader drains the
# agent at channel speed, faster than gRPC hands the bytes to a client: with 1 MiB most followers
# of a 16 MB burst fell behind it (and read it all again from the agent: 0.7-0.9x raw); 4 MiB
# kept them on it (parity with a whole server ring). Server memory per running process stays
# bounded whatever it writes (two streams: 8 MiB), and goes at the exit.
TAIL_BYTES = 4 * 1024 * 1024

AttachEvent = ExecStarted | ExecOutput | ExecExited | ExecKeepalive | OutputGap


@dataclass(frozen=True)
class AgentKept:
    """The output of a background process is in the ring of its sandbox's agent, under
    `detach_id`; `retention` is how much of each stream AttachProcess offers (the process's
    ring as asked for: the agent's own ring has slack for the server's live reader)."""

    container_id: str
    detach_id: str
    retention: int


def next_output(
    buffers: dict[OutputStream, OutputBuffer], cursors: dict[OutputStream, int]
) -> tuple[OutputStream, bytes] | None:
    """The next bytes a reader at `cursors` (each at least its buffer's start) gets: of the
    stream written first, so stdout and stderr replay in the order they were produced."""
    best: tuple[int, OutputStream, bytes] | None = None
    for stream, buffer in buffers.items():
        got = buffer.read(cursors[stream])
        if got is not None and (best is None or got[0] < best[0]):
            best = (got[0], stream, got[1])
    return None if best is None else best[1:]


class HeldTally:
    """The bytes a session's exited records hold in the server's rings, added up as each exits
    (processes/budget.py, Records): the budget asked after every command reads it rather than
    passing over every record. It may count high (a ring that dropped old bytes, a record
    whose output went to the agent after its exit), never low; a high count only costs the
    pass that sets it right."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


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
        self.agent: AgentKept | None = None
        self.tail: dict[OutputStream, OutputBuffer] = {}  # while running, when the agent keeps
        self._ends = {s: 0 for s in OutputStream}  # bytes produced, when the agent keeps them
        # The running command while its stdin takes SendProcessInput (keep_stdin_open).
        self.command: Command | None = None
        self.stdin_lock = asyncio.Lock()  # the first `stdin` goes before any later input
        self.exited: ExecExited | None = None
        # The server's own reader saw the whole output up to the exit (or cut it there: a cap,
        # a timeout), so `end` is final. Not when it failed or was cancelled: then only the
        # agent's copy knows where the output ends.
        self.output_complete = False
        self.followers = 0  # AttachProcess readers now (the agent's copy stays while they read)
        self.running: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None
        self._seq = 0
        self._last: OutputStream | None = None
        self._changed = asyncio.Event()
        # The session's tally while this record is in its Records, and what this adds to it.
        self.tally: HeldTally | None = None
        self.tallied = 0

    def _tally(self, n: int) -> None:
        if self.tally is not None:
            self.tally.bytes += n
            self.tallied += n

    def _notify(self) -> None:
        # Readers hold the event they saw before looking; setting it wakes them all at once.
        self._changed.set()
        self._changed = asyncio.Event()

    def keep_in_agent(self, kept: AgentKept, tail_bytes: int | None = None) -> None:
        """From now on the agent holds the output: this record keeps only its offsets, and a
        live tail of at most `tail_bytes` per stream (0: none, every reader reads the agent)."""
        self.agent = kept
        self.output = {}
        size = min(kept.retention, TAIL_BYTES if tail_bytes is None else tail_bytes)
        if self.exited is None and size > 0:
            self.tail = {s: OutputBuffer(size) for s in OutputStream}

    def changed(self) -> asyncio.Event:
        """Set at the next change of the record (output offsets, exit)."""
        return self._changed

    def end(self, stream: OutputStream) -> int:
        """Bytes of `stream` produced so far (as far as the server has seen)."""
        return self.output[stream].end if self.agent is None else self._ends[stream]

    def first_offset(self, stream: OutputStream) -> int:
        """The oldest offset of `stream` AttachProcess still replays."""
        if self.agent is None:
            return self.output[stream].start
        return max(0, self._ends[stream] - self.agent.retention)

    def append(self, stream: OutputStream, data: bytes) -> None:
        if self.agent is not None:
            self._ends[stream] += len(data)
        buf = self.output.get(stream) or self.tail.get(stream)
        if buf is not None:
            self._seq += 1
            buf.append(data, self._seq, merge=self._last is stream)
            if self.exited is not None:  # output after the exit: counted when it comes
                self._tally(len(data))
        self._last = stream
        self._notify()

    def append_at(self, stream: OutputStream, offset: int, data: bytes) -> None:
        """`append`, after skipping to `offset` (a range lost on the way: detached commands)."""
        end = self.end(stream)
        if offset > end:
            if self.agent is not None:
                self._ends[stream] = offset
            if (buf := self.output.get(stream) or self.tail.get(stream)) is not None:
                buf.skip(offset - end)
            self._notify()
        if data:
            self.append(stream, data)

    def retained_bytes(self) -> int:
        """Bytes held in the server's rings (the live tail is not: it goes at the exit)."""
        return sum(b.end - b.start for b in self.output.values())

    def tail_capacity(self) -> int:
        """What the live tail may come to hold (both streams), while the process runs."""
        return sum(b.capacity for b in self.tail.values())

    def agent_bytes(self) -> int:
        """About what the agent's ring of this process holds in the sandbox's memory: each
        stream's output up to the ring's size (0 when the server holds the output)."""
        if self.agent is None:
            return 0
        return sum(min(n, self.agent.retention) for n in self._ends.values())

    def tail_bytes(self) -> int:
        return sum(b.end - b.start for b in self.tail.values())

    def finish(self, exited: ExecExited, *, complete: bool = False) -> None:
        """The exit; `complete` when the output up to it was all seen here (the command's own
        `exited`), not when the reader ended early and the exit is made up (-1, SIGKILL)."""
        if self.exited is None:
            self.exited = exited
            self.output_complete = complete
            self.tail = {}  # late readers behind read the agent's copy, kept with the record
            if self.agent is None:
                self._tally(self.retained_bytes())
            self._notify()

    async def follow(
        self, stdout_offset: int, stderr_offset: int, keepalive_s: float
    ) -> AsyncIterator[AttachEvent]:
        """started, then output from the offsets (gaps where it is gone), live output, exited."""
        assert self.agent is None, "the agent holds this output: process_agent_output.follow"
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
            if (got := next_output(self.output, cursors)) is not None:
                stream, data = got
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


async def until_running(proc: BackgroundProcess) -> None:
    """Wait until the process runs. Its start ended by the session's end (DeleteSession or the
    lease racing this call cancels it) is an answer, never a call left unanswered."""
    try:
        await asyncio.shield(proc.running)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if proc.running.cancelled() and (task is None or not task.cancelling()):
            raise FailedPrecondition(
                f"the session {proc.session_id!r} ended while process "
                f"{proc.process_id!r} was starting",
                reason=Reason.SESSION_NOT_RUNNING,
                metadata={"session_id": proc.session_id, "process_id": proc.process_id},
            ) from None
        raise


def foreground(
    session_id: str, process_id: str, spec: ExecSpec, origin: ProcessOrigin, buffer_bytes: int
) -> BackgroundProcess:
    """An Exec, Run or Interact command's record, running: they start their command with the
    process id as its token."""
    proc = BackgroundProcess(
        session_id, process_id, spec, StartOptions(buffer_bytes), origin, token=process_id
    )
    proc.running.set_result(None)
    return proc
