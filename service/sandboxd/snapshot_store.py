"""Snapshot records in the session database (their own table), and their content-addressed tars.

A tar is stored once per sha256 under `<data_dir>/snapshots/`, however many records point at
it (forks and unchanged workspaces share it); the file goes when its last record does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import aiosqlite

from sandboxd.schema import migrate, statements
from sandboxd.sqlite_file import commit

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
    snapshot_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    created_at REAL NOT NULL,
    kind TEXT NOT NULL,
    labels TEXT NOT NULL,
    image TEXT NOT NULL DEFAULT '',
    tenant TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS snapshots_session ON snapshots (session_id, created_at);
CREATE INDEX IF NOT EXISTS snapshots_sha ON snapshots (sha256);
CREATE TABLE IF NOT EXISTS pending_image_removals (
    image TEXT PRIMARY KEY,
    since REAL NOT NULL
);
"""
# A disk snapshot's engine-side copy: its disk id and the size of its file system.
_DISK_COLUMNS = """
ALTER TABLE snapshots ADD COLUMN disk TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN disk_bytes INTEGER NOT NULL DEFAULT 0
"""
# 0.1.0, then disk snapshots (sandboxd.schema: new steps go at the end).
_STEPS = (statements(_SCHEMA), statements(_DISK_COLUMNS))

READ_CHUNK = 256 * 1024
# A memory suspend's checkpoint (sessions/memory_suspension.py): stored and counted like a
# snapshot, never one a tenant lists, restores or forks from (it is no workspace tar).
KIND_MEMORY = "MEMORY"
# A disk workspace's snapshot: a sparse copy of its disk the engine keeps (`disk`, of
# `disk_bytes`), no tar; `size_bytes` is what the copy takes on the engine host.
KIND_DISK = "DISK"


@dataclass
class Snapshot:
    snapshot_id: str
    session_id: str
    sha256: str
    size_bytes: int
    created_at: datetime
    kind: str = "TAR"
    labels: dict[str, str] = field(default_factory=dict)
    image: str = ""
    tenant: str = ""
    disk: str = ""
    disk_bytes: int = 0


def new_snapshot(
    session_id: str,
    tenant: str,
    kind: str,
    labels: Mapping[str, str],
    *,
    sha256: str = "",
    size_bytes: int = 0,
) -> Snapshot:
    """A new record of a session's snapshot, taken now under an id of its own: a snapshot, a
    fork's record of the tar it started from and a memory checkpoint are all made here, so
    their ids and times cannot come to differ in form. Its content's sha256 and size are
    `add`'s to set as it stores the tar, but for a fork's record, which shares its origin's."""
    return Snapshot(
        snapshot_id="snap-" + secrets.token_hex(8),
        session_id=session_id,
        sha256=sha256,
        size_bytes=size_bytes,
        created_at=datetime.now(tz=UTC),
        kind=kind,
        labels=dict(labels),
        tenant=tenant,
    )


# The newest of a session's snapshots: the two queries differ only in the kind they pick.
_NEWEST = "ORDER BY created_at DESC, rowid DESC LIMIT 1"
_NEWEST_KEPT = f"SELECT * FROM snapshots WHERE session_id = ? AND kind != ? {_NEWEST}"
_NEWEST_MEMORY = f"SELECT * FROM snapshots WHERE session_id = ? AND kind = ? {_NEWEST}"


def _row(row: aiosqlite.Row) -> Snapshot:
    return Snapshot(
        snapshot_id=row["snapshot_id"],
        session_id=row["session_id"],
        sha256=row["sha256"],
        size_bytes=row["size_bytes"],
        created_at=datetime.fromtimestamp(row["created_at"], tz=UTC),
        kind=row["kind"],
        labels=json.loads(row["labels"]),
        image=row["image"],
        tenant=row["tenant"],
        disk=row["disk"],
        disk_bytes=row["disk_bytes"],
    )


class SnapshotStore:
    """Records in SQLite (sharing the session store's connection) and tar files on disk."""

    def __init__(self, db: aiosqlite.Connection, root: Path) -> None:
        self._db = db
        self.root = root
        # Publishing a tar with its record, and deleting a record with its last tar, must not
        # interleave, or a new record could end up pointing at a file just removed.
        self._content_lock = asyncio.Lock()

    async def open(self) -> SnapshotStore:
        await migrate(self._db, "snapshots", _STEPS)
        await commit(self._db)
        await asyncio.to_thread(self._prepare_dirs)
        return self

    def _prepare_dirs(self) -> None:
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        for leftover in (self.root / "tmp").iterdir():  # writes a crash cut short
            leftover.unlink(missing_ok=True)

    def path_of(self, sha256: str) -> Path:
        return self.root / f"{sha256}.tar"

    # ----- records ----------------------------------------------------------------------

    async def insert(self, s: Snapshot) -> None:
        async with self._content_lock:
            await self._insert(s)

    async def _insert(self, s: Snapshot) -> None:
        await self._db.execute(
            "INSERT INTO snapshots (snapshot_id, session_id, sha256, size_bytes, created_at,"
            " kind, labels, image, tenant, disk, disk_bytes)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                s.snapshot_id,
                s.session_id,
                s.sha256,
                s.size_bytes,
                s.created_at.timestamp(),
                s.kind,
                json.dumps(s.labels),
                s.image,
                s.tenant,
                s.disk,
                s.disk_bytes,
            ),
        )
        await commit(self._db)

    async def _one(self, sql: str, params: Sequence[Any]) -> Snapshot | None:
        async with self._db.execute(sql, params) as cur:
            row = await cur.fetchone()
        return _row(row) if row else None

    async def _all(self, sql: str, params: Sequence[Any]) -> list[Snapshot]:
        rows = await self._db.execute_fetchall(sql, params)
        return [_row(r) for r in rows]

    async def _newest(self, session_id: str, memory: bool) -> Snapshot | None:
        """The session's newest snapshot of a tar or disk kind, or its newest memory checkpoint,
        in the one order both use (newest by time, then by insertion)."""
        sql = _NEWEST_MEMORY if memory else _NEWEST_KEPT
        return await self._one(sql, (session_id, KIND_MEMORY))

    async def get(self, snapshot_id: str) -> Snapshot | None:
        return await self._one("SELECT * FROM snapshots WHERE snapshot_id = ?", (snapshot_id,))

    async def latest(self, session_id: str) -> Snapshot | None:
        return await self._newest(session_id, memory=False)

    async def page(self, *, session_id: str, after: str, limit: int) -> list[Snapshot]:
        sql = "SELECT * FROM snapshots WHERE snapshot_id > ? AND kind != ?"
        params: list[Any] = [after, KIND_MEMORY]
        if session_id:
            sql += " AND session_id = ?"
            params.append(session_id)
        sql += " ORDER BY snapshot_id LIMIT ?"
        params.append(limit)
        return await self._all(sql, params)

    async def of_session(self, session_id: str) -> list[Snapshot]:
        return await self._all(
            "SELECT * FROM snapshots WHERE session_id = ? ORDER BY created_at, rowid",
            (session_id,),
        )

    async def memory_of(self, session_id: str) -> Snapshot | None:
        """The session's newest memory checkpoint, if it has one."""
        return await self._newest(session_id, memory=True)

    async def memory_bytes(self, tenant: str) -> int:
        """What the tenant's memory checkpoints hold on the server's disk (its quota counts it)."""
        async with self._db.execute(
            "SELECT COALESCE(SUM(size_bytes), 0) FROM snapshots WHERE tenant = ? AND kind = ?",
            (tenant, KIND_MEMORY),
        ) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    async def tenant_bytes(self, tenant: str) -> int:
        """What the tenant's snapshots of every kind take: tars and checkpoints on the
        server's disk, disk copies on the engine host's (the tenant's disk quota counts it)."""
        async with self._db.execute(
            "SELECT COALESCE(SUM(size_bytes), 0) FROM snapshots WHERE tenant = ?", (tenant,)
        ) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    async def disks(self) -> set[str]:
        """The disk ids disk snapshots hold (the sweep keeps these)."""
        rows = await self._db.execute_fetchall("SELECT disk FROM snapshots WHERE disk != ''")
        return {str(r[0]) for r in rows}

    async def delete(self, snapshot_id: str) -> Snapshot | None:
        """Remove the record, and the tar when no other record shares it."""
        async with self._content_lock:
            return await self._delete(snapshot_id)

    async def _delete(self, snapshot_id: str) -> Snapshot | None:
        snap = await self.get(snapshot_id)
        if snap is None:
            return None
        await self._db.execute("DELETE FROM snapshots WHERE snapshot_id = ?", (snapshot_id,))
        await commit(self._db)
        await self._unlink_unshared(snap.sha256)
        return snap

    async def _unlink_unshared(self, sha256: str) -> None:
        """Remove the tar of `sha256` when no record points at it (under the content lock)."""
        async with self._db.execute(
            "SELECT COUNT(*) FROM snapshots WHERE sha256 = ?", (sha256,)
        ) as cur:
            row = await cur.fetchone()
        if row is not None and row[0] == 0 and sha256:
            await asyncio.to_thread(self.path_of(sha256).unlink, True)

    async def add_pending_image(self, image: str) -> None:
        """An image Docker refused to remove: kept here until a sweep manages it."""
        await self._db.execute(
            "INSERT OR IGNORE INTO pending_image_removals (image, since) VALUES (?, ?)",
            (image, datetime.now(tz=UTC).timestamp()),
        )
        await commit(self._db)

    async def pending_images(self) -> list[str]:
        rows = await self._db.execute_fetchall("SELECT image FROM pending_image_removals")
        return [str(r[0]) for r in rows]

    async def drop_pending_image(self, image: str) -> None:
        await self._db.execute("DELETE FROM pending_image_removals WHERE image = ?", (image,))
        await commit(self._db)

    async def image_in_use(self, image: str) -> bool:
        async with self._db.execute(
            "SELECT COUNT(*) FROM snapshots WHERE image = ?", (image,)
        ) as cur:
            row = await cur.fetchone()
        return row is not None and row[0] > 0

    async def images_of(self, tenant: str) -> list[str]:
        """The image ids of a tenant's IMAGE snapshots: the only snapshot images it may run."""
        rows = await self._db.execute_fetchall(
            "SELECT DISTINCT image FROM snapshots WHERE tenant = ? AND image != ''", (tenant,)
        )
        return [str(r[0]) for r in rows]

    # ----- content ----------------------------------------------------------------------

    async def add(self, chunks: AsyncIterator[bytes], snap: Snapshot) -> Snapshot:
        """Store a tar as it streams in, then publish it with its record (sha256 and size
        filled in). Never whole in memory; a failure leaves neither file nor record."""
        tmp = self.root / "tmp" / f"{secrets.token_hex(8)}.part"
        writer = _HashingWriter(await asyncio.to_thread(tmp.open, "wb"))
        try:
            async for chunk in chunks:
                await asyncio.to_thread(writer.write, chunk)
            await asyncio.to_thread(writer.finish)
            snap.sha256, snap.size_bytes = writer.hexdigest(), writer.size
            async with self._content_lock:
                await asyncio.to_thread(os.replace, tmp, self.path_of(snap.sha256))
                try:
                    await self._insert(snap)
                except BaseException:
                    # A record refused (a full disk): the tar just published must not stay
                    # without one, unless another record shares it.
                    await asyncio.shield(self._unlink_unshared(snap.sha256))
                    raise
        except BaseException:
            await asyncio.shield(asyncio.to_thread(writer.discard, tmp))
            raise
        return snap

    async def read(self, sha256: str) -> AsyncGenerator[bytes, None]:
        """The stored tar in chunks; raises FileNotFoundError when it is gone."""
        opening = asyncio.ensure_future(asyncio.to_thread(self.path_of(sha256).open, "rb"))
        try:
            fh = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # Cancelled while the thread opens it: the file still opens, so close it then.
            opening.add_done_callback(_close_opened)
            raise
        try:
            while chunk := await asyncio.to_thread(fh.read, READ_CHUNK):
                yield chunk
        finally:
            fh.close()  # read-only: nothing to flush, and it must close even at loop shutdown


def _close_opened(opening: asyncio.Future[Any]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


class _HashingWriter:
    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self._hash.update(data)
        self._fh.write(data)
        self.size += len(data)

    def finish(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()

    def discard(self, path: Path) -> None:
        self._fh.close()
        path.unlink(missing_ok=True)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()
