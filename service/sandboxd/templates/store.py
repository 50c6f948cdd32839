"""Template records in the session database (their own table): one row per tenant and name."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime

import aiosqlite

from sandboxd.schema import migrate, statements
from sandboxd.sqlite_file import commit

_SCHEMA = """
CREATE TABLE IF NOT EXISTS templates (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    image TEXT NOT NULL DEFAULT '',
    tag TEXT NOT NULL DEFAULT '',
    build_id TEXT NOT NULL DEFAULT '',
    size_bytes INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (tenant, name)
);
"""
_STEPS = (statements(_SCHEMA),)  # 0.1.0 (sandboxd.schema: new steps go at the end)


class TemplateState(enum.StrEnum):
    BUILDING = "BUILDING"
    READY = "READY"
    FAILED = "FAILED"


@dataclass(frozen=True)
class TemplateRecord:
    name: str
    state: TemplateState
    created_at: datetime
    tenant: str = ""
    image: str = ""  # the built image's id (READY)
    tag: str = ""  # the engine tag it was built under
    build_id: str = ""  # the label value its intermediate images carry
    size_bytes: int = 0
    message: str = ""
    builtin: bool = False


def _row(row: aiosqlite.Row) -> TemplateRecord:
    return TemplateRecord(
        name=row["name"],
        state=TemplateState(row["state"]),
        created_at=datetime.fromtimestamp(row["created_at"], tz=UTC),
        tenant=row["tenant"],
        image=row["image"],
        tag=row["tag"],
        build_id=row["build_id"],
        size_bytes=row["size_bytes"],
        message=row["message"],
    )


class TemplateStore:
    """Shares the session store's connection (one database file, one writer)."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def open(self) -> TemplateStore:
        await migrate(self._db, "templates", _STEPS)
        # A build the last run of the server did not finish never will.
        await self._db.execute(
            "UPDATE templates SET state = ?, message = ? WHERE state = ?",
            (TemplateState.FAILED, "the server restarted during the build", TemplateState.BUILDING),
        )
        await commit(self._db)
        return self

    async def put(self, t: TemplateRecord) -> None:
        await self._db.execute(
            "INSERT OR REPLACE INTO templates (tenant, name, state, image, tag, build_id,"
            " size_bytes, created_at, message) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                t.tenant,
                t.name,
                t.state,
                t.image,
                t.tag,
                t.build_id,
                t.size_bytes,
                t.created_at.timestamp(),
                t.message,
            ),
        )
        await commit(self._db)

    async def get(self, tenant: str, name: str) -> TemplateRecord | None:
        async with self._db.execute(
            "SELECT * FROM templates WHERE tenant = ? AND name = ?", (tenant, name)
        ) as cur:
            row = await cur.fetchone()
        return _row(row) if row is not None else None

    async def of_tenant(self, tenant: str) -> list[TemplateRecord]:
        rows = await self._db.execute_fetchall(
            "SELECT * FROM templates WHERE tenant = ? ORDER BY name", (tenant,)
        )
        return [_row(r) for r in rows]

    async def failed_build_ids(self) -> list[str]:
        """Build labels of every failed build (all tenants): what a crash may have left."""
        rows = await self._db.execute_fetchall(
            "SELECT build_id FROM templates WHERE state = ? AND build_id != ''",
            (TemplateState.FAILED,),
        )
        return [r["build_id"] for r in rows]

    async def delete(self, tenant: str, name: str) -> None:
        await self._db.execute(
            "DELETE FROM templates WHERE tenant = ? AND name = ?", (tenant, name)
        )
        await commit(self._db)
