"""Volume records in the session database (their own table): one row per tenant and id.

The disk is named in the row, so every later step (mount, export, delete, the sweep) finds
the same disk whatever the id; the id is the caller's name for it, unique per tenant only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiosqlite

from sandboxd.schema import migrate, statements
from sandboxd.sqlite_file import commit

_SCHEMA = """
CREATE TABLE IF NOT EXISTS volumes (
    tenant TEXT NOT NULL,
    volume_id TEXT NOT NULL,
    disk TEXT NOT NULL UNIQUE,
    size_bytes INTEGER NOT NULL,
    labels TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL,
    used_bytes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, volume_id)
)
"""
_STEPS = (statements(_SCHEMA),)  # the table's first step (sandboxd.schema: new ones at the end)


@dataclass(frozen=True)
class VolumeRecord:
    tenant: str
    volume_id: str
    disk: str
    size_bytes: int
    created_at: datetime
    labels: dict[str, str] = field(default_factory=dict)
    used_bytes: int = 0  # as last measured (GetVolume, ImportVolume measure it)


def _row(row: aiosqlite.Row) -> VolumeRecord:
    return VolumeRecord(
        tenant=row["tenant"],
        volume_id=row["volume_id"],
        disk=row["disk"],
        size_bytes=row["size_bytes"],
        created_at=datetime.fromtimestamp(row["created_at"], tz=UTC),
        labels=json.loads(row["labels"]),
        used_bytes=row["used_bytes"],
    )


class VolumeStore:
    """Shares the session store's connection (one database file, one writer): the mounts of a
    volume are read from the session records of the same file (SessionStore.volume_users)."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def open(self) -> VolumeStore:
        await migrate(self._db, "volumes", _STEPS)
        await commit(self._db)
        return self

    async def insert(self, v: VolumeRecord) -> None:
        await self._db.execute(
            "INSERT INTO volumes (tenant, volume_id, disk, size_bytes, labels, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                v.tenant,
                v.volume_id,
                v.disk,
                v.size_bytes,
                json.dumps(v.labels, sort_keys=True),
                v.created_at.timestamp(),
            ),
        )
        await commit(self._db)

    async def get(self, tenant: str, volume_id: str) -> VolumeRecord | None:
        async with self._db.execute(
            "SELECT * FROM volumes WHERE tenant = ? AND volume_id = ?", (tenant, volume_id)
        ) as cur:
            row = await cur.fetchone()
        return _row(row) if row is not None else None

    async def page(
        self, tenant: str, after: str, limit: int, labels: dict[str, str]
    ) -> list[VolumeRecord]:
        """The tenant's volumes after `after` in id order, with every one of `labels`."""
        sql = "SELECT * FROM volumes WHERE tenant = ? AND volume_id > ?"
        params: list[object] = [tenant, after]
        for key, value in labels.items():
            sql += " AND json_extract(labels, ?) = ?"
            params += [f'$."{key}"', value]
        sql += " ORDER BY volume_id LIMIT ?"
        params.append(limit)
        return [_row(r) for r in await self._db.execute_fetchall(sql, params)]

    async def usage(self, tenant: str) -> tuple[int, int]:
        """(volumes, bytes of their sizes) the tenant holds, for its quota."""
        async with self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM volumes WHERE tenant = ?",
            (tenant,),
        ) as cur:
            row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    async def disks(self) -> set[str]:
        """Every disk a volume record holds (all tenants): what the sweep must keep."""
        return {str(r[0]) for r in await self._db.execute_fetchall("SELECT disk FROM volumes")}

    async def set_used(self, tenant: str, volume_id: str, used_bytes: int) -> None:
        await self._db.execute(
            "UPDATE volumes SET used_bytes = ? WHERE tenant = ? AND volume_id = ?",
            (used_bytes, tenant, volume_id),
        )
        await commit(self._db)

    async def delete(self, tenant: str, volume_id: str) -> None:
        await self._db.execute(
            "DELETE FROM volumes WHERE tenant = ? AND volume_id = ?", (tenant, volume_id)
        )
        await commit(self._db)
