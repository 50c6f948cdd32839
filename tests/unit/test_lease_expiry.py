"""The reaper's expiry action per session (sandboxd.leases) on the engine fake: SUSPEND keeps a
resumable session with its files, SNAPSHOT_THEN_DELETE keeps a snapshot, DELETE is as before,
and every ended session says why."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fakes import FakeArchive, FakeCommands, FakeEngine
from sandboxd.config import Config
from sandboxd.leases import DELETE, SNAPSHOT_THEN_DELETE, SUSPEND, ExpiryPolicy, LeaseTermsStore
from sandboxd.models import ManifestFile, SessionState, WorkspaceManifest
from sandboxd.sessions import CreateSessionInput, SessionManager
from sandboxd.snapshot_store import SnapshotStore
from sandboxd.snapshots import SnapshotKeeper
from sandboxd.store import SessionStore

MANIFEST = WorkspaceManifest(files=(ManifestFile("keep.txt", b"kept", 0o644),))


@contextlib.asynccontextmanager
async def _stack(
    tmp_path: Path,
) -> AsyncIterator[tuple[SessionManager, SessionStore, LeaseTermsStore, SnapshotStore]]:
    engine = FakeEngine()
    async with SessionStore(tmp_path / "sessions.db") as store:
        snaps = await SnapshotStore(store.db, tmp_path / "snapshots").open()
        keeper = SnapshotKeeper(snaps, FakeArchive(engine), engine, "sbxunit")
        terms = await LeaseTermsStore(store.db).open()
        policy = ExpiryPolicy(terms, keeper, store, suspend_for=timedelta(hours=1))
        sessions = SessionManager(
            Config(data_dir=tmp_path),
            engine,
            store,
            "sbxunit",
            keeper,
            on_expiry=policy,
            commands=FakeCommands(engine),
        )
        yield sessions, store, terms, snaps


async def _end_lease(store: SessionStore, session_id: str) -> None:
    s = await store.get(session_id)
    assert s is not None
    s.lease_expires_at = datetime.now(UTC) - timedelta(seconds=1)
    await store.update(s)


async def test_suspend_at_expiry_then_resume_finds_the_files(tmp_path: Path) -> None:
    async with _stack(tmp_path) as (sessions, store, terms, snaps):
        await sessions.create(CreateSessionInput(session_id="s1", manifest=MANIFEST))
        await terms.set_terms("s1", SUSPEND, False)
        await _end_lease(store, "s1")
        await sessions.reap_once()
        s = await sessions.get("s1")
        assert s.state is SessionState.SUSPENDED and s.lease_expires_at > datetime.now(UTC)
        assert (await terms.get("s1")).end_reason.startswith("lease expired; suspended")
        assert len(await snaps.of_session("s1")) == 1
        resumed = await sessions.resume("s1", None)
        assert resumed.state is SessionState.RUNNING
        # Suspended already when the lease ends: it expires for good (no second extension).
        await sessions.suspend("s1")
        await _end_lease(store, "s1")
        await sessions.reap_once()
        assert (await sessions.get("s1")).state is SessionState.EXPIRED


async def test_snapshot_then_delete_and_delete(tmp_path: Path) -> None:
    async with _stack(tmp_path) as (sessions, store, terms, snaps):
        for sid, action in (("snap", SNAPSHOT_THEN_DELETE), ("plain", DELETE)):
            await sessions.create(CreateSessionInput(session_id=sid, manifest=MANIFEST))
            await terms.set_terms(sid, action, False)
            await _end_lease(store, sid)
        await sessions.create(CreateSessionInput(session_id="untermed"))
        await _end_lease(store, "untermed")
        assert await sessions.reap_once() == 3
        for sid in ("snap", "plain", "untermed"):
            assert (await sessions.get(sid)).state is SessionState.EXPIRED
        (kept,) = await snaps.of_session("snap")
        assert (await terms.get("snap")).end_reason == (
            f"lease expired; snapshot {kept.snapshot_id} kept"
        )
        assert await snaps.of_session("plain") == []
        assert (await terms.get("plain")).end_reason == "lease expired"
        assert (await terms.get("untermed")).on_expiry == DELETE


async def test_a_failed_snapshot_never_keeps_a_session_alive(tmp_path: Path) -> None:
    async with _stack(tmp_path) as (sessions, store, terms, _):
        s = await sessions.create(CreateSessionInput(session_id="s1"))
        await terms.set_terms("s1", SUSPEND, False)
        await sessions._engine.remove_sandbox(s.container_id)  # type: ignore[attr-defined]
        await _end_lease(store, "s1")
        await sessions.reap_once()
        assert (await sessions.get("s1")).state is SessionState.EXPIRED
        assert (await terms.get("s1")).end_reason.startswith("lease expired; snapshot failed")
