"""Upgrades keep data: the stores open the data directory of release 0.1.0 (committed under
tests/data, written by that release's server: one suspended session with a file, a snapshot,
audit events), record each part's schema version, read every record as it was, open again
without running a step twice, and refuse data a newer server wrote."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path

import pytest
from sandboxd.audit.events import AuditQuery
from sandboxd.audit.store import AuditStore
from sandboxd.errors import ConfigError
from sandboxd.leases.terms import LeaseTermsStore
from sandboxd.models import SessionState
from sandboxd.previews.registry import PortRegistry
from sandboxd.schema import migrate, statements, version_of
from sandboxd.snapshot_store import SnapshotStore
from sandboxd.store import SessionStore
from sandboxd.templates.store import TemplateStore

RELEASE = Path(__file__).resolve().parents[1] / "data" / "release-0.1.0" / "data"
PARTS = {"sessions", "snapshots", "session_terms", "templates", "preview_ports"}


@pytest.fixture
def old_data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(RELEASE, data)
    return data


def _versions(db_file: Path) -> dict[str, int]:
    with sqlite3.connect(db_file) as db:
        return dict(db.execute("SELECT part, version FROM schema_versions").fetchall())


async def _open_all(data: Path) -> tuple[int, int, int]:
    async with SessionStore(data / "sessions.db") as store:
        snapshots = await SnapshotStore(store.db, data / "snapshots").open()
        terms = await LeaseTermsStore(store.db).open()
        await TemplateStore(store.db).open()
        await PortRegistry(store.db).open()
        (session,) = await store.all()
        assert session.session_id == "kept" and session.labels == {"team": "blue"}
        assert session.state is SessionState.SUSPENDED and session.tenant == "default"
        assert (await terms.get("kept")).on_expiry == "DELETE"
        kept = await snapshots.of_session("kept")
    async with AuditStore(data / "audit.db") as audit:
        events = await audit.list(AuditQuery(tenant="default", limit=100))
    return len(kept), len(events), len({e.kind for e in events})


def test_the_previous_release_opens_with_every_record(old_data: Path) -> None:
    with sqlite3.connect(old_data / "sessions.db") as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "schema_versions" not in tables  # as that release wrote it
    snapshots, events, kinds = asyncio.run(_open_all(old_data))
    assert snapshots == 2 and events == 5 and kinds == 4
    assert set(_versions(old_data / "sessions.db")) == PARTS
    assert _versions(old_data / "audit.db") == {"audit_events": 1}
    # A second start runs no step again and changes nothing.
    before = (_versions(old_data / "sessions.db"), _versions(old_data / "audit.db"))
    assert asyncio.run(_open_all(old_data)) == (snapshots, events, kinds)
    assert (_versions(old_data / "sessions.db"), _versions(old_data / "audit.db")) == before


def test_data_of_a_newer_server_is_refused(old_data: Path) -> None:
    asyncio.run(_open_all(old_data))
    with sqlite3.connect(old_data / "sessions.db") as db:
        db.execute("UPDATE schema_versions SET version = 99 WHERE part = 'sessions'")
    with pytest.raises(ConfigError, match="schema version 99, newer than this server's"):
        asyncio.run(_open_all(old_data))


def test_steps_run_in_order_once_each_in_the_callers_transaction(tmp_path: Path) -> None:
    import aiosqlite

    ran: list[int] = []

    def step(n: int, sql: str):  # type: ignore[no-untyped-def]
        inner = statements(sql)

        async def run(db: aiosqlite.Connection) -> None:
            ran.append(n)
            await inner(db)

        return run

    steps = [step(1, "CREATE TABLE t (a INTEGER)"), step(2, "ALTER TABLE t ADD COLUMN b TEXT")]

    async def go(upto: int, commit: bool) -> int:
        async with aiosqlite.connect(tmp_path / "x.db") as db:
            version = await migrate(db, "t", steps[:upto])
            if commit:
                await db.commit()
            return version

    assert asyncio.run(go(1, commit=True)) == 1
    assert asyncio.run(go(2, commit=False)) == 2  # killed before its commit: nothing stays
    assert ran == [1, 2]

    async def current() -> int:
        async with aiosqlite.connect(tmp_path / "x.db") as db:
            return await version_of(db, "t")

    assert asyncio.run(current()) == 1
    assert asyncio.run(go(2, commit=True)) == 2
    assert ran == [1, 2, 2]
