"""Snapshots of disk workspaces: a sparse copy of the workspace's disk the engine keeps.

A snapshot of a disk workspace (CreateSnapshot with no kind, a lease's snapshot at expiry) is
made on the engine host by the disk tool (`Disks.copy`: `cp --sparse=always` of the disk's
image, the sandbox paused for the copy), never read through the server: a GiB of files costs
seconds, not the minute its tar takes (docs/workspaces.md has the figures). A fork from it is
a second such copy, given to the fork's own host uid. Its disk id is the snapshot's id, so
the sweep knows a snapshot's disk from a workspace's and a volume's (other prefixes) and
removes one no record holds (a server that died between the copy and the record, a removal
the engine refused).

What it is not: a tar. It cannot be downloaded (SNAPSHOT_NOT_DOWNLOADABLE: take a TAR
snapshot), and it lives and dies with the engine host's volumes, like the disk it copies.
"""

from __future__ import annotations

import asyncio
import logging

from sandboxd.engine.protocol import Engine
from sandboxd.errors import SandboxError
from sandboxd.models import Session
from sandboxd.snapshot_store import KIND_DISK, Snapshot, SnapshotStore

log = logging.getLogger(__name__)

# Every snapshot id is `snap-` and 16 hex digits (sandboxd.snapshots): a disk id as it is.
SNAPSHOT_DISK_PREFIX = "snap-"


class DiskSnapshots:
    def __init__(self, engine: Engine, store: SnapshotStore) -> None:
        self._engine = engine
        self._store = store
        self._making: set[str] = set()  # copies whose record is not written yet

    async def take(self, session: Session, snap: Snapshot) -> Snapshot:
        """`snap` filled in and recorded, its disk a copy of the session's; nothing is left
        when this raises (a copy refused for room, a record that could not be written)."""
        snap.kind = KIND_DISK
        snap.disk = snap.snapshot_id
        snap.disk_bytes = session.spec.limits.workspace_bytes
        self._making.add(snap.disk)
        try:
            # uid 0: the copy keeps its owners (nobody mounts a snapshot; a fork's copy of it
            # is given to the fork's uid).
            usage = await self._engine.disks.copy(
                session.spec.disk_id, snap.disk, 0, 0, freeze=session.container_id
            )
            snap.size_bytes = usage.allocated_bytes
            try:
                await self._store.insert(snap)
            except BaseException:
                await asyncio.shield(self._engine.disks.delete(snap.disk))
                raise
        finally:
            self._making.discard(snap.disk)
        return snap

    async def forget(self, snap: Snapshot) -> None:
        """The copy of a snapshot whose record is gone; a removal the engine refuses is the
        sweep's to retry."""
        try:
            await self._engine.disks.delete(snap.disk)
        except SandboxError as exc:
            log.warning("disk of snapshot %s not removed yet (%s)", snap.snapshot_id, exc)

    async def sweep(self) -> int:
        """Remove the snapshot disks no record holds; how many. Listed before the records
        are read, and a copy under way is kept (its record comes after it)."""
        disks = [
            d for d in await self._engine.disks.list_ids() if d.startswith(SNAPSHOT_DISK_PREFIX)
        ]
        if not disks:
            return 0
        keep = await self._store.disks() | self._making
        removed = 0
        for disk_id in disks:
            if disk_id in keep:
                continue
            try:
                if await self._engine.disks.delete(disk_id):
                    removed += 1
            except SandboxError as exc:
                log.warning("could not remove the snapshot disk %s: %s", disk_id, exc)
        return removed
