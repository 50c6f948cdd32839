"""The published ports of each session, in their own table of the session database.

A row per (session, port): its tenant, whether it is public, the expiry of its newest token
and that token's generation (random, so a port unpublished and published again never accepts
a token of its earlier life). Rows live as long as the session runs: the session-end hook
(delete, suspend, expiry, a lost sandbox) removes them, and so does start-up for sessions that
did not survive a restart.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import aiosqlite

from sandboxd.schema import migrate, statements
from sandboxd.sqlite_file import commit

_SCHEMA = """
CREATE TABLE IF NOT EXISTS preview_ports (
    session_id TEXT NOT NULL,
    port INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    generation INTEGER NOT NULL,
    public INTEGER NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (session_id, port)
);
"""
_STEPS = (statements(_SCHEMA),)  # 0.1.0 (sandboxd.schema: new steps go at the end)


@dataclass(frozen=True)
class Publication:
    session_id: str
    port: int
    tenant: str
    generation: int
    public: bool
    expires_at: float


class PortRegistry:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def open(self) -> PortRegistry:
        await migrate(self._db, "preview_ports", _STEPS)
        await commit(self._db)
        return self

    async def publish(
        self, session_id: str, port: int, tenant: str, public: bool, expires_at: float
    ) -> Publication:
        """Publish (or publish again, with a new generation: older tokens stop working)."""
        pub = Publication(session_id, port, tenant, secrets.randbits(52), public, expires_at)
        await self._db.execute(
            "INSERT OR REPLACE INTO preview_ports VALUES (?, ?, ?, ?, ?, ?)",
            (session_id, port, tenant, pub.generation, int(public), expires_at),
        )
        await commit(self._db)
        return pub

    async def get(self, session_id: str, port: int) -> Publication | None:
        async with self._db.execute(
            "SELECT * FROM preview_ports WHERE session_id = ? AND port = ?", (session_id, port)
        ) as cur:
            row = await cur.fetchone()
        return _publication(row) if row else None

    async def of_session(self, session_id: str) -> list[Publication]:
        rows = await self._db.execute_fetchall(
            "SELECT * FROM preview_ports WHERE session_id = ? ORDER BY port", (session_id,)
        )
        return [_publication(r) for r in rows]

    async def sessions(self) -> list[str]:
        rows = await self._db.execute_fetchall("SELECT DISTINCT session_id FROM preview_ports")
        return [str(r[0]) for r in rows]

    async def remove(self, session_id: str, port: int) -> bool:
        cur = await self._db.execute(
            "DELETE FROM preview_ports WHERE session_id = ? AND port = ?", (session_id, port)
        )
        await commit(self._db)
        return bool(cur.rowcount)

    async def remove_session(self, session_id: str) -> None:
        await self._db.execute("DELETE FROM preview_ports WHERE session_id = ?", (session_id,))
        await commit(self._db)


def _publication(row: aiosqlite.Row | tuple[object, ...]) -> Publication:
    session_id, port, tenant, generation, public, expires_at = tuple(row)
    return Publication(
        str(session_id),
        int(str(port)),
        str(tenant),
        int(str(generation)),
        bool(public),
        float(str(expires_at)),
    )
