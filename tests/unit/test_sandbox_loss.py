"""A dead sandbox's record (models.Loss) on the engine fake: found dead, a session with a
snapshot is rebuilt from it and says from which and how old; one without says its workspace is
gone; a Suspend and Resume of the caller's own is no loss; the record outlives the server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from fakes import FakeArchive, FakeCommands, FakeEngine
from sandboxd.config import Config
from sandboxd.models import ManifestFile, SessionState, WorkspaceManifest
from sandboxd.sessions import CreateSessionInput, SessionManager
from sandboxd.snapshot_store import SnapshotStore
from sandboxd.snapshots import SnapshotKeeper
from sandboxd.store import SessionStore

MANIFEST = WorkspaceManifest(files=(ManifestFile("keep.txt", b"kept", 0o644),))


@contextlib.asynccontextmanager
async def _stack(
    tmp_path: Path,
) -> AsyncIterator[tuple[SessionManager, SnapshotKeeper, FakeEngine]]:
    engine = FakeEngine()
    async with SessionStore(tmp_path / "sessions.db") as store:
        snaps = await SnapshotStore(store.db, tmp_path / "snapshots").open()
        keeper = SnapshotKeeper(snaps, FakeArchive(engine), engine, "sbxunit")
        yield (
            SessionManager(
                Config(data_dir=tmp_path),
                engine,
                store,
                "sbxunit",
                keeper,
                commands=FakeCommands(engine),
            ),
            keeper,
            engine,
        )


async def test_a_dead_sandbox_is_rebuilt_from_its_snapshot_and_says_so(tmp_path: Path) -> None:
    async with _stack(tmp_path) as (sessions, keeper, engine):
        made = await sessions.create(CreateSessionInput(session_id="s1", manifest=MANIFEST))
        snap = await keeper.take(made, {})
        engine.lose(made.container_id)
        await sessions.reconcile()
        lost = await sessions.get("s1")
        assert lost.state is SessionState.SUSPENDED and lost.loss is not None
        assert lost.loss.snapshot_id == snap.snapshot_id and lost.loss.restored_at is None
        assert "rebuilt on the next call" in lost.loss.message()
        back = await sessions.resume("s1", None)
        assert back.state is SessionState.RUNNING and back.loss is not None
        assert back.loss.restored_at is not None and back.loss.snapshot_at == snap.created_at
        assert snap.snapshot_id in back.loss.message() and "lost" in back.loss.message()
        # A Suspend and Resume of the caller's own changes nothing of it.
        await sessions.suspend("s1")
        again = await sessions.resume("s1", None)
        assert again.loss == back.loss
    async with _stack(tmp_path) as (sessions, _, _):  # the record outlives the server
        assert (await sessions.get("s1")).loss == back.loss


async def test_a_dead_sandbox_without_a_snapshot_says_its_workspace_is_gone(
    tmp_path: Path,
) -> None:
    async with _stack(tmp_path) as (sessions, _, engine):
        made = await sessions.create(CreateSessionInput(session_id="s1", manifest=MANIFEST))
        engine.lose(made.container_id)
        await sessions.reconcile()
        lost = await sessions.get("s1")
        assert lost.state is SessionState.FAILED and lost.loss is not None
        assert lost.loss.snapshot_id == "" and "workspace are lost" in lost.loss.message()
