"""Per-session lease terms, in their own table of the session database.

Their own table (not the session's spec JSON) because they are not part of what a session is
(its fingerprint) but of how its end is handled, and `end_reason` is written when it ends.
A session without a row has the defaults: delete at expiry, no renewal on activity.

Every command asks for its session's terms (renew on activity), so they are kept in memory once
read, as the session records are (sandboxd.store): the table stays the truth, a write reaches
the memory copy only by dropping it (the next read is the table's word), a read that raced a
write keeps nothing, and a restart starts with nothing in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiosqlite

from sandboxd.schema import migrate, statements
from sandboxd.sqlite_file import commit

DELETE = "DELETE"
SUSPEND = "SUSPEND"
SNAPSHOT_THEN_DELETE = "SNAPSHOT_THEN_DELETE"
EXPIRY_ACTIONS = (DELETE, SUSPEND, SNAPSHOT_THEN_DELETE)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS session_terms (
    session_id TEXT PRIMARY KEY,
    on_expiry TEXT NOT NULL,
    renew_on_activity INTEGER NOT NULL,
    end_reason TEXT NOT NULL DEFAULT ''
);
"""
_STEPS = (statements(_SCHEMA),)  # 0.1.0 (sandboxd.schema: new steps go at the end)


@dataclass(frozen=True)
class LeaseTerms:
    on_expiry: str = DELETE
    renew_on_activity: bool = False
    end_reason: str = ""


class LeaseTermsStore:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db
        self._cache: dict[str, LeaseTerms] = {}  # as read from the table (defaults: no row)
        self._writes = 0  # writes begun: a read that saw this change under it keeps nothing

    def _dropping(self, session_id: str | None) -> None:
        """Before a write (and again after it, whatever its outcome): one session's copy,
        or every copy (None)."""
        self._writes += 1
        if session_id is None:
            self._cache.clear()
        else:
            self._cache.pop(session_id, None)

    async def open(self) -> LeaseTermsStore:
        await migrate(self._db, "session_terms", _STEPS)
        await commit(self._db)
        return self

    async def set_terms(self, session_id: str, on_expiry: str, renew_on_activity: bool) -> None:
        self._dropping(session_id)
        try:
            await self._db.execute(
                "INSERT INTO session_terms (session_id, on_expiry, renew_on_activity)"
                " VALUES (?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET"
                " on_expiry = excluded.on_expiry, renew_on_activity = excluded.renew_on_activity",
                (session_id, on_expiry, int(renew_on_activity)),
            )
            await commit(self._db)
        finally:
            self._dropping(session_id)

    async def get(self, session_id: str) -> LeaseTerms:
        cached = self._cache.get(session_id)
        if cached is not None:
            return cached  # frozen: shared safely
        writes = self._writes
        terms = await self._read(session_id)
        if writes == self._writes:
            self._cache[session_id] = terms
        return terms

    async def _read(self, session_id: str) -> LeaseTerms:
        async with self._db.execute(
            "SELECT on_expiry, renew_on_activity, end_reason FROM session_terms"
            " WHERE session_id = ?",
            (session_id,),
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            return LeaseTerms()
        return LeaseTerms(str(row[0]), bool(row[1]), str(row[2]))

    async def set_end_reason(self, session_id: str, reason: str) -> None:
        self._dropping(session_id)
        try:
            await self._db.execute(
                "INSERT INTO session_terms (session_id, on_expiry, renew_on_activity, end_reason)"
                " VALUES (?, ?, 0, ?) ON CONFLICT(session_id) DO UPDATE SET"
                " end_reason = excluded.end_reason",
                (session_id, DELETE, reason),
            )
            await commit(self._db)
        finally:
            self._dropping(session_id)

    async def forget_orphans(self) -> None:
        """Rows of sessions whose record is gone (deleted, or pruned after retention)."""
        self._dropping(None)
        try:
            await self._db.execute(
                "DELETE FROM session_terms WHERE session_id NOT IN"
                " (SELECT session_id FROM sessions)"
            )
            await commit(self._db)
        finally:
            self._dropping(None)
