"""Who mounts a volume: one writer at a time, or readers, never both; checked and recorded
with no other claim of the same volume between.

The mounts of a volume are the session records that name it (SessionStore.volume_users): a
create holds the volume's lock from its check until its record is written, and DeleteVolume,
ImportVolume and ExportVolume hold the same lock while they look and act. Nothing else records
a mount, so a session that ends (deleted, expired, a create taken back) frees its volumes by
its record alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterable, Sequence

from sandboxd import tenancy
from sandboxd.errors import FailedPrecondition, NotFound
from sandboxd.models import SessionState, VolumeMount
from sandboxd.reasons import Reason
from sandboxd.session_locks import SessionLocks
from sandboxd.store import SessionStore
from sandboxd.volumes.port import VolumeDisks
from sandboxd.volumes.store import VolumeRecord, VolumeStore

# A session in one of these states mounts its volumes (a suspended one mounts them again at
# resume, so it keeps its claim; an ended one holds nothing).
MOUNTING_STATES = (
    SessionState.CREATING.value,
    SessionState.RUNNING.value,
    SessionState.SUSPENDED.value,
)


def volume_not_found(volume_id: str) -> NotFound:
    """Another tenant's volume answers exactly like a missing one."""
    return NotFound(
        f"volume {volume_id!r} not found",
        reason=Reason.VOLUME_NOT_FOUND,
        metadata={"volume_id": volume_id},
    )


def volume_in_use(volume_id: str, session_id: str, why: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"volume {volume_id!r} is mounted by session {session_id!r}: {why}",
        reason=Reason.VOLUME_IN_USE,
        metadata={"volume_id": volume_id, "session_id": session_id},
    )


class VolumeClaims:
    def __init__(self, volumes: VolumeStore, sessions: SessionStore, disks: VolumeDisks) -> None:
        self._volumes = volumes
        self._sessions = sessions
        self.disks = disks
        self._locks = SessionLocks()  # keyed "tenant\0volume_id"

    @contextlib.asynccontextmanager
    async def locked(self, volume_ids: Iterable[str]) -> AsyncIterator[None]:
        """The locks of the calling tenant's `volume_ids`, taken in one order (no deadlock)."""
        tenant = tenancy.current()
        async with contextlib.AsyncExitStack() as stack:
            for volume_id in sorted(set(volume_ids)):
                await stack.enter_async_context(self._locks.locked(f"{tenant}\0{volume_id}"))
            yield

    async def record(self, volume_id: str) -> VolumeRecord:
        found = await self._volumes.get(tenancy.current(), volume_id)
        if found is None:
            raise volume_not_found(volume_id)
        return found

    async def users(self, volume_id: str) -> list[tuple[str, bool]]:
        """(session id, read-only) of the calling tenant's sessions that mount the volume."""
        return await self._sessions.volume_users(tenancy.current(), volume_id, MOUNTING_STATES)

    async def require_unmounted(self, volume_id: str, why: str, *, readers_ok: bool) -> None:
        """Under the volume's lock: refuse while a session writes it (or, unless `readers_ok`,
        while any session mounts it)."""
        for session_id, read_only in await self.users(volume_id):
            if not read_only or not readers_ok:
                raise volume_in_use(volume_id, session_id, why)

    @contextlib.asynccontextmanager
    async def claiming(
        self, mounts: Sequence[VolumeMount], uid: int, gid: int
    ) -> AsyncIterator[tuple[VolumeMount, ...]]:
        """The mounts with their disks, for a create that writes its record inside the block.

        A read-write mount needs the volume unmounted; a read-only one needs no writer: a
        reader never sees a volume another session is changing under it. A volume mounted
        read-write is handed to the session's host uid:gid first (its files become the
        session's: the last writer's uid is no other session's)."""
        if not mounts:
            yield ()
            return
        async with self.locked(m.volume_id for m in mounts):
            resolved = []
            for m in mounts:
                found = await self.record(m.volume_id)
                if m.read_only:
                    why = "a read-only mount waits for its writer to end"
                    await self.require_unmounted(m.volume_id, why, readers_ok=True)
                else:
                    why = "a volume has one writer at a time (mount it read_only to share it)"
                    await self.require_unmounted(m.volume_id, why, readers_ok=False)
                    await self.disks.own_disk(found.disk, uid, gid)
                resolved.append(dataclasses.replace(m, disk=found.disk))
            yield tuple(resolved)


@contextlib.asynccontextmanager
async def claim_volumes(
    claims: VolumeClaims | None, mounts: Sequence[VolumeMount], host_id: int
) -> AsyncIterator[tuple[VolumeMount, ...]]:
    """A create's claim of its volumes, for the session's host identity (`claiming`); a
    server without volumes finds none."""
    if claims is None:
        if mounts:
            raise volume_not_found(mounts[0].volume_id)
        yield ()
        return
    async with claims.claiming(mounts, host_id, host_id) as resolved:
        yield resolved
