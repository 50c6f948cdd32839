"""The one writer of audit events: batches commits, acknowledges each event after its commit.

Calls put an event on the queue and await its future; the writer task takes everything queued,
writes it in one transaction, appends it to the JSON Lines export, and only then resolves the
futures. So the durability promise is per event (an answered call's event is committed), while
concurrent calls share one commit. A store failure fails the waiting calls: an event that could
not be recorded must not look recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sandboxd import disk_full
from sandboxd.audit.events import AuditEvent
from sandboxd.audit.store import AuditStore
from sandboxd.errors import SandboxError, Unavailable

log = logging.getLogger(__name__)

MAX_BATCH = 512
MAX_QUEUED = 10_000  # beyond this, callers wait for room: backpressure instead of memory


class AuditWriter:
    def __init__(
        self,
        store: AuditStore | None,
        *,
        export_path: Path | None = None,
        max_age_s: float = 30 * 86400.0,
        max_bytes: int = 256 * 1024 * 1024,
        batch_window_s: float = 0.0,
        on_unrecorded: Callable[[int, int], None] | None = None,
    ) -> None:
        # Told (answered, dropped) for each batch a failed write did not record (metrics).
        self._on_unrecorded = on_unrecorded
        self._batch_window_s = batch_window_s
        self._store = store
        self._export_path = export_path
        self._export_fd: int | None = None
        self._max_age_s = max_age_s
        self._max_bytes = max_bytes
        self._queue: asyncio.Queue[tuple[AuditEvent, asyncio.Future[AuditEvent] | None]] = (
            asyncio.Queue(MAX_QUEUED)
        )
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self._store is not None

    def start(self) -> None:
        if self._store is None or self._task is not None:
            return
        if self._export_path is not None:
            self._export_path.parent.mkdir(parents=True, exist_ok=True)
            self._export_fd = os.open(
                self._export_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640
            )
        self._task = asyncio.create_task(self._run(), name="audit-writer")

    async def close(self) -> None:
        """Write what is queued, then stop (after the gRPC server stopped: nothing new comes)."""
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._queue.join(), 10.0)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._export_fd is not None:
            os.close(self._export_fd)
            self._export_fd = None

    def record(self, event: AuditEvent) -> Awaitable[AuditEvent]:
        """Queue `event`; what is returned completes once it is committed (with its id); no-op
        when disabled. Queued at once, and the future the writer completes is itself what is
        awaited (a call's scope defers it: no task and no shield per record); a full queue
        gives a wait for room first."""
        future: asyncio.Future[AuditEvent] = asyncio.get_running_loop().create_future()
        if self._store is None:
            future.set_result(event)
            return future
        try:
            self._queue.put_nowait((event, future))
        except asyncio.QueueFull:
            return self._record_when_room(event, future)
        return future

    async def _record_when_room(
        self, event: AuditEvent, future: asyncio.Future[AuditEvent]
    ) -> AuditEvent:
        await self._queue.put((event, future))
        return await asyncio.shield(future)

    def record_nowait(self, event: AuditEvent) -> None:
        """For decisions no call waits on (the egress proxy): queued, never blocking the caller.

        A full queue drops the event with a log line rather than stalling a proxied connection.
        """
        if self._store is None:
            return
        try:
            self._queue.put_nowait((event, None))
        except asyncio.QueueFull:
            log.warning("audit queue full: dropped a %s event of %s", event.kind, event.session_id)

    async def prune(self) -> int:
        if self._store is None:
            return 0
        removed = await self._store.prune(
            older_than=time.time() - self._max_age_s, max_bytes=self._max_bytes
        )
        if removed:
            log.info("audit retention: pruned %d event(s)", removed)
        return removed

    async def run_retention(self, interval_s: float) -> None:
        while True:
            try:
                await self.prune()
            except Exception:
                log.exception("audit retention failed")
            await asyncio.sleep(interval_s)

    async def _gather(
        self, batch: list[tuple[AuditEvent, asyncio.Future[AuditEvent] | None]]
    ) -> None:
        """What else is queued; with a batch window, what arrives within it too (fewer, larger
        commits under load, each call waiting at most the window longer)."""
        deadline = asyncio.get_running_loop().time() + self._batch_window_s
        while len(batch) < MAX_BATCH:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), left))
            except TimeoutError:
                return

    async def _run(self) -> None:
        assert self._store is not None
        while True:
            batch = [await self._queue.get()]
            await self._gather(batch)
            try:
                written = await self._store.append([event for event, _ in batch])
                if self._export_fd is not None:
                    data = "".join(e.to_json() + "\n" for e in written).encode()
                    await asyncio.to_thread(_append, self._export_fd, data)
            except Exception as exc:
                # Not retried here: the batch's calls are answered with the failure (their
                # events not recorded, so not looking recorded); an event no call waits on
                # (record_nowait) is dropped, counted in this line and the metrics. A full
                # disk is the operator's SERVER_DISK_FULL; the next batch is a fresh write.
                unwaited = sum(1 for _, future in batch if future is None)
                log.exception(
                    "audit write failed (%d event(s), %d dropped unanswered)", len(batch), unwaited
                )
                if self._on_unrecorded is not None:
                    self._on_unrecorded(len(batch) - unwaited, unwaited)
                failure: SandboxError = disk_full.error_for(exc) or Unavailable(
                    f"the audit log could not be written: {exc}"
                )
                for _, future in batch:
                    if future is not None and not future.done():
                        future.set_exception(failure)
            else:
                for (_, future), event in zip(batch, written, strict=True):
                    if future is not None and not future.done():
                        future.set_result(event)
            finally:
                for _ in batch:
                    self._queue.task_done()


def _append(fd: int, data: bytes) -> None:
    """All of `data`: a write may take less than it was given (a signal, a nearly full disk),
    and a shipper reading the export must never meet half a line followed by the next."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
