"""The server's own disk full: a write to the data directory that finds no space is answered
RESOURCE_EXHAUSTED with reason SERVER_DISK_FULL naming the directory (never INTERNAL), reads
keep answering, and the next write after space returns succeeds on the same open store.

The full disk is SQLite's own: `PRAGMA max_page_count` caps the file at the pages it has, so
the next page it needs fails with the real SQLITE_FULL ("database or disk is full") through
aiosqlite, the error a full file system gives; raising the cap is space returning."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiosqlite
import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from sandboxd import disk_full
from sandboxd.api import errors as api_errors
from sandboxd.audit import AuditStore, AuditWriter
from sandboxd.audit.events import AuditEvent
from sandboxd.metrics import Metrics
from sandboxd.models import SessionState
from sandboxd.reasons import Reason
from sandboxd.sessions import CreateSessionInput
from sandboxd.snapshot_store import SnapshotStore, new_snapshot
from sandboxd.store import SessionStore

from tests.unit.test_api_answered import _Context
from tests.unit.test_lease_expiry import MANIFEST, _end_lease, _stack
from tests.unit.test_store_memory import _session

BIG = "x" * 20_000  # labels that need new pages: a few rows fill what the cap leaves


async def _fill(db: aiosqlite.Connection) -> int:
    """Cap the file at the pages it has now; return the cap (to raise it again later)."""
    async with db.execute("PRAGMA page_count") as cur:
        row = await cur.fetchone()
    assert row is not None
    pages = int(row[0])
    await db.execute(f"PRAGMA max_page_count = {pages}")
    return pages


async def _free(db: aiosqlite.Connection, pages: int) -> None:
    await db.execute(f"PRAGMA max_page_count = {pages * 100}")


class _Servicer:
    def __init__(self, store: SessionStore) -> None:
        self.store = store

    @api_errors.unary
    async def Create(self, request: Any, context: Any) -> str:  # noqa: N802 - gRPC's style
        session = _session(request)
        session.labels = {"big": BIG}
        await self.store.insert(session)
        return "created"


def _reason(status: grpc.Status) -> str:
    (raw,) = [v for k, v in status.trailing_metadata if k == "grpc-status-details-bin"]
    proto = status_pb2.Status.FromString(raw)
    info = error_details_pb2.ErrorInfo()
    proto.details[0].Unpack(info)
    return info.reason


async def test_a_session_write_on_a_full_disk_is_server_disk_full_and_recovers(
    tmp_path: Path,
) -> None:
    async with SessionStore(tmp_path / "sessions.db") as store:
        await store.insert(_session("before"))
        pages = await _fill(store.db)
        servicer = _Servicer(store)
        context = _Context()
        with pytest.raises(grpc.aio.AbortError):
            await servicer.Create("s-full", context)
        assert context.status is not None
        assert context.status.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _reason(context.status) == Reason.SERVER_DISK_FULL
        assert "data directory" in context.status.details
        assert str(tmp_path) not in context.status.details  # a host path is the log's
        # Nothing half-written, and reads still answer.
        assert await store.get("s-full") is None
        before = await store.get("before")
        assert before is not None and before.session_id == "before"
        # Space returns: the same open store writes again, no restart.
        await _free(store.db, pages)
        assert await servicer.Create("s-full", _Context()) == "created"
        assert await store.get("s-full") is not None


async def test_sqlite_full_is_told_apart_from_other_errors() -> None:
    full = sqlite3.OperationalError("database or disk is full")
    assert disk_full.cause(full) is full
    assert disk_full.cause(sqlite3.OperationalError("no such table: x")) is None
    assert disk_full.cause(OSError(errno.EACCES, "denied")) is None
    try:
        try:
            raise full
        except sqlite3.Error as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as outer:
        assert disk_full.cause(outer) is full


async def test_a_file_write_with_no_space_names_its_directory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """To the operator, in the log; never to the caller, who is not told the host's paths."""
    exc = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "snapshots" / "a.tar"))
    error = disk_full.error_for(exc)
    assert error is not None and error.reason == Reason.SERVER_DISK_FULL
    assert str(tmp_path) not in error.message
    assert str(tmp_path / "snapshots") in caplog.text
    assert api_errors.status_code_for(error) == grpc.StatusCode.RESOURCE_EXHAUSTED
    quota = disk_full.error_for(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert quota is not None


def _event(n: int) -> AuditEvent:
    return AuditEvent.of("command", time=time.time(), tenant="alpha", session_id="s1", n=n, b=BIG)


async def test_an_audit_batch_on_a_full_disk_fails_its_calls_then_recovers(
    tmp_path: Path,
) -> None:
    """The events of a batch that could not be committed are not acknowledged (the calls
    waiting on them are answered SERVER_DISK_FULL, not told they were recorded); the writer
    keeps running and commits the next batch once space returns."""
    async with AuditStore(tmp_path / "audit.db") as store:
        writer = AuditWriter(store)
        writer.start()
        await writer.record(_event(0))
        pages = await _fill(store.db)
        with pytest.raises(disk_full.ServerDiskFull):
            await asyncio.gather(*(writer.record(_event(i)) for i in range(1, 20)))
        await _free(store.db, pages)
        written = await writer.record(_event(99))
        assert written.id is not None
        await writer.close()


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def test_a_snapshot_whose_record_cannot_be_written_leaves_no_file(tmp_path: Path) -> None:
    """The tar is published under its sha256 before its record is inserted: a record the full
    disk refused left the published tar behind, a file no record points at (found by this
    test). Now neither file nor record stays; a tar another record shares is kept."""
    async with SessionStore(tmp_path / "sessions.db") as store:
        snaps = await SnapshotStore(store.db, tmp_path / "snapshots").open()
        shared = await snaps.add(_chunks(b"shared"), new_snapshot("s1", "alpha", "TAR", {}))
        pages = await _fill(store.db)
        big = {"big": BIG}
        with pytest.raises(sqlite3.OperationalError) as raised:
            await snaps.add(_chunks(b"new tar"), new_snapshot("s1", "alpha", "TAR", big))
        assert disk_full.error_for(raised.value) is not None
        with pytest.raises(sqlite3.OperationalError):
            await snaps.add(_chunks(b"shared"), new_snapshot("s1", "alpha", "TAR", big))
        files = sorted(p.name for p in (tmp_path / "snapshots").rglob("*") if p.is_file())
        assert files == [f"{shared.sha256}.tar"]  # the shared tar stays, nothing else
        assert [s.snapshot_id for s in await snaps.of_session("s1")] == [shared.snapshot_id]
        await _free(store.db, pages)
        again = await snaps.add(_chunks(b"new tar"), new_snapshot("s1", "alpha", "TAR", big))
        assert snaps.path_of(again.sha256).exists()


async def test_audit_events_a_full_disk_did_not_record_are_counted(tmp_path: Path) -> None:
    """An event no call waits on (an egress decision) has no one to tell: dropped, it is
    counted in the metrics (sandboxd_audit_unrecorded, by fate) as well as logged, and so is
    every event whose call was answered with the failure."""
    metrics = Metrics()
    async with AuditStore(tmp_path / "audit.db") as store:
        writer = AuditWriter(store, on_unrecorded=metrics.audit_unrecorded_events)
        writer.start()
        await writer.record(_event(0))
        pages = await _fill(store.db)
        for i in range(3):
            writer.record_nowait(_event(100 + i))
        with pytest.raises(disk_full.ServerDiskFull):
            await writer.record(_event(1))
        await _free(store.db, pages)
        await writer.close()
    dropped = metrics.registry.get_sample_value(
        "sandboxd_audit_unrecorded_total", {"fate": "dropped"}
    )
    answered = metrics.registry.get_sample_value(
        "sandboxd_audit_unrecorded_total", {"fate": "answered"}
    )
    assert (dropped, answered) == (3.0, 1.0)


async def _real_full_error(tmp_path: Path) -> sqlite3.Error:
    """SQLite's own SQLITE_FULL, as aiosqlite raises it from a capped file."""
    async with aiosqlite.connect(tmp_path / "full.db") as db:
        await db.execute("CREATE TABLE t (v TEXT)")
        await db.commit()
        await _fill(db)
        try:
            await db.execute("INSERT INTO t VALUES (?)", (BIG,))
        except sqlite3.Error as exc:
            return exc
    raise AssertionError("the capped file took the row")


async def test_the_lease_reaper_survives_a_full_disk_and_expires_once_space_returns(
    tmp_path: Path,
) -> None:
    """A full disk under the reaper raised past its `except SandboxError`: its task ended, and
    the server's task group, which runs it, stopped the whole server. Now the round is logged
    and the next one expires the lease."""
    full = await _real_full_error(tmp_path)
    async with _stack(tmp_path) as (sessions, store, _terms, _snaps):
        await sessions.create(CreateSessionInput(session_id="s1", manifest=MANIFEST))
        await _end_lease(store, "s1")
        recovery = sessions._recovery
        expire = recovery.expire
        failures = [full]

        async def expire_on_a_full_disk(session: Any) -> Any:
            if failures:
                raise failures.pop()
            return await expire(session)

        recovery.expire = expire_on_a_full_disk  # type: ignore[method-assign]
        reaper = asyncio.create_task(sessions.run_reaper(3600.0))
        try:
            for _ in range(100):
                await asyncio.sleep(0.01)
                if not failures:
                    break
            await asyncio.sleep(0.05)
            assert not reaper.done(), reaper.exception()
            sessions._recovery.wake()
            for _ in range(100):
                await asyncio.sleep(0.01)
                if (await sessions.get("s1")).state is SessionState.EXPIRED:
                    break
            assert (await sessions.get("s1")).state is SessionState.EXPIRED
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper


class _PingingEngine:
    async def ping(self) -> str:
        return "1.43"


async def test_the_engine_monitor_survives_a_full_disk_under_its_reconcile(
    tmp_path: Path,
) -> None:
    """The reconcile run when the engine comes back writes records: a full disk there ended
    the monitor's task (and so the server); now it is logged and tried at the next check."""
    from grpc_health.v1 import health
    from sandboxd.api.engine_health import EngineMonitor

    failures = [await _real_full_error(tmp_path)]
    reconciled: list[bool] = []

    async def on_up() -> None:
        if failures:
            raise failures.pop()
        reconciled.append(True)

    monitor = EngineMonitor(_PingingEngine(), health.aio.HealthServicer(), on_up, ())  # type: ignore[arg-type]
    await monitor.check()
    assert monitor.up is not True and not reconciled
    await monitor.check()
    assert monitor.up is True and reconciled == [True]
