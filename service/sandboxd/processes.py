"""Background processes: started by one call, outliving it, reattached to by byte offset.

A `BackgroundProcess` runs in a task the `ProcessManager` owns (closed on shutdown, and for a
session when it is deleted or its lease ends). Its output goes into one bounded ring buffer per
stream, addressed by absolute byte offset, so memory per process is capped and the process is
never slowed by readers.

Readers (`follow`) do not get pushed copies of the output: each keeps its own cursor per stream
and reads the shared buffer when woken. A slow or dead reader therefore holds nothing and stalls
nothing; if it falls so far behind that its next byte has left the buffer, it is told exactly
which range it lost (`OutputGap`) rather than skipping it silently. The exit record is kept after
the process ends, so a late reader still gets `exited`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime

from sandboxd import validation
from sandboxd.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    ResourceExhausted,
    SandboxError,
)
from sandboxd.exec_spec import validate_signal
from sandboxd.execution import CHUNK_BYTES, Executor, new_token
from sandboxd.models import (
    ExecExited,
    ExecKeepalive,
    ExecOutput,
    ExecSpec,
    ExecStarted,
    OutputStream,
    Session,
)
from sandboxd.reasons import Reason

log = logging.getLogger(__name__)

MAX_PROCESSES_PER_SESSION = 64  # running plus retained exit records; oldest exited go first
EXITED_OUTPUT_BYTES = 64 * 1024 * 1024  # output kept for exited processes, per session
# Output buffers one session's background processes may reserve in all: a running process
# reserves two rings of its max_output_bytes, an exited one what it still keeps. Without it,
# 64 processes x 2 x 16 MiB would let one session hold 2 GiB of server memory.
# TODO(lead): setting
SESSION_OUTPUT_BUFFER_BYTES = 128 * 1024 * 1024
MERGE_BYTES = CHUNK_BYTES  # consecutive writes of one stream share a chunk (grown in place)...
MAX_CHUNKS = 8192  # ...and the chunk count is bounded too, so tiny writes cannot bloat memory


@dataclass(frozen=True)
class OutputGap:
    """Bytes [offset, offset+length) of `stream` left the buffer before this reader got them."""

    stream: OutputStream
    offset: int
    length: int


AttachEvent = ExecStarted | ExecOutput | ExecExited | ExecKeepalive | OutputGap


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


class BackgroundProcess:
    """One StartProcess process: its spec, output buffers and, once ended, its exit record."""

    def __init__(self, session_id: str, process_id: str, spec: ExecSpec) -> None:
        self.session_id = session_id
        self.process_id = process_id
        self.spec = spec
        self.token = new_token()
        self.started_at = datetime.now(tz=UTC)
        self.output = {s: OutputBuffer(spec.max_output_bytes) for s in OutputStream}
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


class ProcessManager:
    """Owns every background process and the task running it."""

    def __init__(
        self,
        executor: Executor,
        on_exit: Callable[[Session, BackgroundProcess], None] | None = None,
    ) -> None:
        self._executor = executor
        self._on_exit = on_exit  # the audit log and the session's event feed
        self._by_session: dict[str, dict[str, BackgroundProcess]] = {}

    async def close(self) -> None:
        """Server shutdown: end every background process (their trees are killed)."""
        for session_id in list(self._by_session):
            await self.end_session(session_id)

    async def end_session(self, session_id: str) -> None:
        """The session is being deleted or its lease ended: end and forget its processes."""
        procs = self._by_session.pop(session_id, {})
        tasks = [p.task for p in procs.values() if p.task is not None and not p.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def start(
        self,
        session: Session,
        spec: ExecSpec,
        process_id: str = "",
        hold: AbstractAsyncContextManager[None] | None = None,
    ) -> BackgroundProcess:
        """Start `spec` in the background; the same id with the same spec returns that process.

        `hold` (a tenant's exec slot) is entered before the process starts and left when it ends.
        """
        pid = validation.validate_process_id(process_id) if process_id else new_token()
        procs = self._by_session.setdefault(session.session_id, {})
        proc = procs.get(pid)
        if proc is not None:
            if proc.spec != spec:
                raise AlreadyExists(
                    f"process {pid!r} already exists in this session with a different command",
                    reason=Reason.PROCESS_ALREADY_EXISTS,
                    metadata={"process_id": pid},
                )
            await asyncio.shield(proc.running)
            return proc
        self._make_room(procs)
        self._reserve_buffers(procs, spec)
        proc = BackgroundProcess(session.session_id, pid, spec)
        procs[pid] = proc
        proc.task = asyncio.create_task(
            self._run(session, proc, hold or contextlib.nullcontext()), name=f"process {pid}"
        )
        try:
            await asyncio.shield(proc.running)
        except SandboxError:
            if procs.get(pid) is proc:
                del procs[pid]
            raise
        return proc

    @staticmethod
    def _forget_old_exited(procs: dict[str, BackgroundProcess]) -> None:
        """Exit records keep their output for late readers, up to EXITED_OUTPUT_BYTES in all."""
        exited = sorted((p for p in procs.values() if p.exited), key=lambda p: p.started_at)
        total = sum(p.retained_bytes() for p in exited)
        for old in exited:
            if total <= EXITED_OUTPUT_BYTES:
                break
            total -= old.retained_bytes()
            del procs[old.process_id]

    @staticmethod
    def _reserve_buffers(procs: dict[str, BackgroundProcess], spec: ExecSpec) -> None:
        """Room in the session's buffer budget for two rings of `spec`'s output cap: old exit
        records go first; if running processes hold it all, the start is refused."""
        need = 2 * spec.max_output_bytes

        def reserved() -> int:
            return sum(
                p.retained_bytes() if p.exited else 2 * p.spec.max_output_bytes
                for p in procs.values()
            )

        exited = sorted((p for p in procs.values() if p.exited), key=lambda p: p.started_at)
        while reserved() + need > SESSION_OUTPUT_BUFFER_BYTES and exited:
            del procs[exited.pop(0).process_id]
        if reserved() + need > SESSION_OUTPUT_BUFFER_BYTES:
            raise ResourceExhausted(
                f"this session's background processes already reserve {reserved()} bytes of "
                f"output buffers; {need} more (two streams of max_output_bytes) would pass the "
                f"budget of {SESSION_OUTPUT_BUFFER_BYTES}: end a process or lower "
                "max_output_bytes",
                reason=Reason.OUTPUT_BUFFER_BUDGET,
                metadata={"limit": str(SESSION_OUTPUT_BUFFER_BYTES)},
            )

    def _make_room(self, procs: dict[str, BackgroundProcess]) -> None:
        if len(procs) < MAX_PROCESSES_PER_SESSION:
            return
        exited = [p for p in procs.values() if p.exited is not None]
        if not exited:
            raise ResourceExhausted(
                f"this session already runs {MAX_PROCESSES_PER_SESSION} background processes",
                reason=Reason.TOO_MANY_PROCESSES,
                metadata={"limit": str(MAX_PROCESSES_PER_SESSION)},
            )
        oldest = min(exited, key=lambda p: p.started_at)
        del procs[oldest.process_id]

    async def _run(
        self, session: Session, proc: BackgroundProcess, hold: AbstractAsyncContextManager[None]
    ) -> None:
        started = time.monotonic()
        try:
            async with (
                hold,
                self._executor.start(
                    session, proc.spec, process_id=proc.process_id, token=proc.token
                ) as command,
            ):
                proc.running.set_result(None)
                command.feed(proc.spec.stdin)
                async for event in command.events(cap_output=False):
                    if isinstance(event, ExecOutput):
                        proc.append(event.stream, event.data)
                    elif isinstance(event, ExecExited):
                        proc.finish(event)
            procs = self._by_session.get(proc.session_id)
            if procs is not None:
                self._forget_old_exited(procs)
        except SandboxError as exc:
            if not proc.running.done():
                proc.running.set_exception(exc)
                return
            log.warning("background process %s: %s", proc.process_id, exc)
            proc.finish(ExecExited(-1, "", False, False, time.monotonic() - started))
        except asyncio.CancelledError:
            if not proc.running.done():
                proc.running.cancel()
            proc.finish(ExecExited(137, "SIGKILL", False, False, time.monotonic() - started))
            raise
        finally:
            if proc.exited is not None and self._on_exit is not None:
                self._on_exit(session, proc)

    def get(self, session_id: str, process_id: str) -> BackgroundProcess:
        proc = self._by_session.get(session_id, {}).get(process_id)
        if proc is None:
            raise NotFound(
                f"no background process {process_id[:80]!r} in session {session_id!r}",
                reason=Reason.PROCESS_NOT_FOUND,
                metadata={"process_id": process_id[:80]},
            )
        return proc

    def list(self, session_id: str) -> list[BackgroundProcess]:
        return sorted(self._by_session.get(session_id, {}).values(), key=lambda p: p.started_at)

    async def signal(self, session: Session, process_id: str, name: str) -> None:
        validate_signal(name)
        proc = self.get(session.session_id, process_id)
        if proc.exited is not None:
            raise FailedPrecondition(
                f"process {process_id!r} has already exited",
                reason=Reason.PROCESS_EXITED,
                metadata={"process_id": process_id},
            )
        await self._executor.signal(session, proc.token, name)
