"""One SQLite file of the data directory, opened by `async with`: the shared way to open it.

Every store of the server (sessions, audit) keeps its own file with the same settings: WAL, so
readers never wait for the writer; synchronous=NORMAL, so a commit is durable against a crash
of the server (the case the stores guard against) without an fsync per transaction; aiosqlite,
so the event loop never blocks on disk. A subclass names its part and its schema steps
(sandboxd.schema), run in order at open.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path
from types import TracebackType
from typing import Self

import aiosqlite

from sandboxd.schema import Step, migrate


async def commit(db: aiosqlite.Connection) -> None:
    """Commit one change, or roll it back whole when the commit fails. In WAL mode the pages
    reach the disk at COMMIT, and after SQLITE_FULL (a full disk) SQLite may leave the
    transaction open: its statements would then be committed by the next change of any store
    on the connection (lease terms and ports share the sessions' one), a record written after
    its caller was told it was refused and its work undone."""
    try:
        await db.commit()
    except BaseException:
        with contextlib.suppress(sqlite3.Error, ValueError):  # ValueError: a closed connection
            await asyncio.shield(db.rollback())
        raise


class SqliteFile:
    """Base of a store kept in one SQLite file; `db` is usable inside `async with` only."""

    PART = ""  # the name of its schema version (sandboxd.schema)
    STEPS: tuple[Step, ...] = ()
    ROWS_BY_NAME = True  # rows as aiosqlite.Row (by name and index) rather than tuples
    # No implicit BEGIN before a write (each statement commits as it ends, unless inside an
    # explicit BEGIN, as the schema steps are): for a store whose writes are single statements.
    AUTOCOMMIT = False

    def __init__(self, path: Path) -> None:
        self._path = path
        self._db: aiosqlite.Connection | None = None

    async def __aenter__(self) -> Self:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        db = await (
            aiosqlite.connect(self._path, isolation_level=None)
            if self.AUTOCOMMIT
            else aiosqlite.connect(self._path)
        )
        try:
            if self.ROWS_BY_NAME:
                db.row_factory = aiosqlite.Row
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA synchronous=NORMAL")
            self._db = db
            await migrate(db, self.PART, self.STEPS)
            await db.commit()
        except BaseException:
            self._db = None
            await db.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None

    @property
    def db(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError(f"{type(self).__name__} used outside its 'async with'")
        return self._db
