"""A change whose commit is refused (a full disk: in WAL mode the pages reach the file at
COMMIT, and SQLite may leave the transaction open after SQLITE_FULL) is rolled back whole: it
never rides on the next change's commit. Before, a session record refused with
SERVER_DISK_FULL (its CreateSession undone, its container removed) was written by the next
successful write of any other record.

The fault is injected at the commit only; every statement runs on the real SQLite file."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sandboxd.leases.terms import LeaseTerms, LeaseTermsStore
from sandboxd.store import SessionStore

from tests.unit.test_store_memory import _session


class _CommitRefusedOnce:
    """The store's own aiosqlite connection, but its next commit fails as a full disk's does."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.refuse = False

    async def commit(self) -> None:
        if self.refuse:
            self.refuse = False
            raise sqlite3.OperationalError("database or disk is full")
        await self._db.commit()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


async def test_a_refused_session_record_is_not_written_by_the_next_change(tmp_path: Path) -> None:
    async with SessionStore(tmp_path / "sessions.db") as store:
        real = store._db
        store._db = _CommitRefusedOnce(real)  # type: ignore[assignment]
        store.db.refuse = True  # type: ignore[attr-defined]
        with pytest.raises(sqlite3.OperationalError):
            await store.insert(_session("s-refused"))
        await store.insert(_session("s-next"))
        store._db = real
    async with SessionStore(tmp_path / "sessions.db") as reopened:
        assert await reopened.get("s-refused") is None
        assert await reopened.get("s-next") is not None


async def test_a_refused_change_of_lease_terms_is_not_written_by_the_next_change(
    tmp_path: Path,
) -> None:
    """Lease terms, published ports and sessions share one connection: a change of one
    refused must not be committed by a change of another."""
    async with SessionStore(tmp_path / "sessions.db") as store:
        real = store._db
        store._db = _CommitRefusedOnce(real)  # type: ignore[assignment]
        terms = await LeaseTermsStore(store.db).open()
        store.db.refuse = True  # type: ignore[attr-defined]
        with pytest.raises(sqlite3.OperationalError):
            await terms.set_terms("s-refused", "snapshot", True)
        await store.insert(_session("s-next"))
        store._db = real
    async with SessionStore(tmp_path / "sessions.db") as reopened:
        terms = await LeaseTermsStore(reopened.db).open()
        assert await terms.get("s-refused") == LeaseTerms()
        assert await reopened.get("s-next") is not None
