"""A tenant's disk quota: its disk workspaces, volumes and snapshots together.

One cap (`tenant_max_disk_bytes`, 0: none) on what a tenant makes the hosts hold. Counted from
the records, so a restarted server counts what exists, never a tally it kept: disk workspaces
of live sessions and volumes at their size (a ceiling the tenant can fill at any time: the cap
is hard only if the ceiling counts), snapshots at what they take (a tar's bytes, a disk copy's
allocated bytes; a tar forks share is counted once). Memory checkpoints are the image quota's.

Checked at create and fork (the disk's size), CreateVolume (its size) and CreateSnapshot
(before, any room at all; after, the snapshot's real size: over the cap, it is taken back).
Creates of sessions and volumes check and write their record under one lock per tenant, so
two of them cannot both pass on the same remaining room.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from sandboxd.errors import ResourceExhausted
from sandboxd.reasons import Reason
from sandboxd.snapshot_store import KIND_MEMORY, SnapshotStore
from sandboxd.store import SessionStore
from sandboxd.volumes.store import VolumeStore

# Sessions whose disk counts: every state but the ended ones (their disk is removed).
_ENDED = ("EXPIRED", "FAILED")


class DiskQuota:
    def __init__(
        self,
        limit_bytes: int,
        sessions: SessionStore,
        volumes: VolumeStore,
        snapshots: SnapshotStore,
    ) -> None:
        self.limit_bytes = limit_bytes
        self._sessions = sessions
        self._volumes = volumes
        self._snapshots = snapshots
        self._locks: dict[str, asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def locked(self, tenant: str) -> AsyncIterator[None]:
        """Held across a check and the write of the record it admits."""
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            yield

    async def used(self, tenant: str) -> int:
        workspaces = await self._workspace_bytes(tenant)
        _, volumes = await self._volumes.usage(tenant)
        async with self._sessions.db.execute(
            "SELECT COALESCE(SUM(taken), 0) FROM (SELECT MAX(size_bytes) AS taken FROM snapshots"
            " WHERE tenant = ? AND kind != ?"
            " GROUP BY CASE WHEN disk != '' THEN 'd' || disk ELSE 't' || sha256 END)",
            (tenant, KIND_MEMORY),
        ) as cur:
            row = await cur.fetchone()
        snapshots = int(row[0]) if row is not None else 0
        return workspaces + volumes + snapshots

    async def _workspace_bytes(self, tenant: str) -> int:
        marks = ", ".join("?" for _ in _ENDED)
        async with self._sessions.db.execute(
            "SELECT COALESCE(SUM(json_extract(spec, '$.limits.workspace_bytes')), 0)"
            f" FROM sessions WHERE tenant = ? AND state NOT IN ({marks})"
            " AND COALESCE(json_extract(spec, '$.disk_id'), '') != ''",
            (tenant, *_ENDED),
        ) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    async def check(self, tenant: str, asked_bytes: int, what: str) -> None:
        """RESOURCE_EXHAUSTED TENANT_DISK_QUOTA when `asked_bytes` more would pass the cap."""
        if not self.limit_bytes:
            return
        used = await self.used(tenant)
        if used + asked_bytes > self.limit_bytes:
            raise self.refused(tenant, used, asked_bytes, what)

    def refused(self, tenant: str, used: int, asked_bytes: int, what: str) -> ResourceExhausted:
        remaining = max(self.limit_bytes - used, 0)
        return ResourceExhausted(
            f"tenant {tenant!r} holds {used} bytes of disk (workspaces, volumes, snapshots); "
            f"{what} of {asked_bytes} bytes would pass its quota of {self.limit_bytes} "
            f"({remaining} remain): delete a session, volume or snapshot first",
            reason=Reason.TENANT_DISK_QUOTA,
            metadata={
                "tenant": tenant,
                "quota_bytes": str(self.limit_bytes),
                "used_bytes": str(used),
                "remaining_bytes": str(remaining),
                "asked_bytes": str(asked_bytes),
            },
        )
