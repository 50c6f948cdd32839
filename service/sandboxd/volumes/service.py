"""VolumeService's domain: create, get, list, delete, export and import a tenant's volumes.

Every call acts for the calling tenant (sandboxd.tenancy) and finds only its volumes: another
tenant's id is NOT_FOUND, whatever it holds. A volume's disk is made before its record and
removed after it, and the sweep removes only disks of this server that no record holds and no
create is making, so neither a crash nor a failed call leaves a disk that a volume owns
unaccounted for, nor removes one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sandboxd import domain_events, paging, tenancy, validation
from sandboxd.config_sections import VolumesSection
from sandboxd.errors import AlreadyExists, Internal, ResourceExhausted, SandboxError
from sandboxd.reasons import Reason
from sandboxd.session_locks import SessionLocks
from sandboxd.volumes import checks
from sandboxd.volumes.claims import VolumeClaims
from sandboxd.volumes.disk_quota import DiskQuota
from sandboxd.volumes.port import DISK_PREFIX, VolumeDisks, VolumePorter
from sandboxd.volumes.store import VolumeRecord, VolumeStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Volume:
    """A volume as the API shows it: its record, what it holds now, who mounts it."""

    record: VolumeRecord
    used_bytes: int = 0
    attached: tuple[tuple[str, bool], ...] = field(default_factory=tuple)


class Volumes:
    def __init__(
        self,
        settings: VolumesSection,
        store: VolumeStore,
        claims: VolumeClaims,
        disks: VolumeDisks,
        owner_id: str,
        porter: VolumePorter | None = None,
        observer: domain_events.Observer = domain_events.SILENT,  # its lifecycle, transfers
        disk_quota: DiskQuota | None = None,  # None: no tenant_max_disk_bytes
    ) -> None:
        self._observer = observer
        self._disk_quota = disk_quota
        self._settings = settings
        self._store = store
        self._claims = claims
        self._disks = disks
        self._porter = porter
        del owner_id  # disks are scoped to it by the mechanism (storage.disks)
        self._prefix = DISK_PREFIX
        self._making: set[str] = set()  # disks made whose record is not written yet
        self._tenant_locks = SessionLocks()

    # ----- create -----------------------------------------------------------------------

    async def create(self, volume_id: str, size_bytes: int, labels: Mapping[str, str]) -> Volume:
        if volume_id:
            checks.validate_volume_id(volume_id)
        else:
            volume_id = f"v-{secrets.token_hex(8)}"
        size = checks.check_size(size_bytes, self._settings.default_bytes, self._settings.max_bytes)
        labels = validation.validate_labels(labels)
        tenant = tenancy.current()
        async with self._claims.locked([volume_id]):
            existing = await self._store.get(tenant, volume_id)
            if existing is not None:
                if existing.size_bytes == size and existing.labels == labels:
                    self._observer.emit(domain_events.VolumeCreated(tenant, volume_id, size))
                    return await self._view(existing)  # the same request again
                raise AlreadyExists(
                    f"volume {volume_id!r} already exists with another size or labels",
                    reason=Reason.VOLUME_ALREADY_EXISTS,
                    metadata={"volume_id": volume_id},
                )
            quota = self._disk_quota
            async with (
                self._tenant_locks.locked(tenant),
                quota.locked(tenant) if quota is not None else contextlib.nullcontext(),
            ):
                await self._check_quota(tenant, size)
                if quota is not None:
                    await quota.check(tenant, size, "a volume")
                record = VolumeRecord(
                    tenant=tenant,
                    volume_id=volume_id,
                    disk=self._prefix + secrets.token_hex(10),
                    size_bytes=size,
                    created_at=datetime.now(UTC),
                    labels=labels,
                )
                await self._make(record)
        log.info("volume created", extra={"volume_id": volume_id})
        self._observer.emit(domain_events.VolumeCreated(tenant, volume_id, size))
        return await self._view(record, measure=False)  # empty: nothing to measure yet

    async def _check_quota(self, tenant: str, size: int) -> None:
        count, total = await self._store.usage(tenant)
        most, most_bytes = self._settings.tenant_max_volumes, self._settings.tenant_max_bytes
        if most and count + 1 > most:
            why = f"tenant {tenant!r} already has {count} volumes; the quota is {most}"
        elif most_bytes and total + size > most_bytes:
            why = (
                f"tenant {tenant!r} volumes hold {total} bytes; {size} more would pass the "
                f"quota of {most_bytes}"
            )
        else:
            return
        raise ResourceExhausted(
            f"{why} (delete a volume first)",
            reason=Reason.VOLUME_QUOTA_EXCEEDED,
            metadata={
                "tenant": tenant,
                "max_volumes": str(most),
                "max_bytes": str(most_bytes),
            },
        )

    async def _make(self, record: VolumeRecord) -> None:
        """The disk, then its record; a failure takes the disk back (nothing half-made)."""
        self._making.add(record.disk)
        try:
            await self._disks.create_disk(record.disk, record.size_bytes)
            try:
                await self._store.insert(record)
            except BaseException:
                await asyncio.shield(self._remove_disk(record.disk))
                raise
        finally:
            self._making.discard(record.disk)

    # ----- reads ------------------------------------------------------------------------

    async def get(self, volume_id: str) -> Volume:
        checks.validate_volume_id(volume_id)
        return await self._view(await self._claims.record(volume_id))

    async def list(
        self, label_selector: Mapping[str, str], page_size: int, page_token: str
    ) -> tuple[list[Volume], str]:
        size = paging.page_size(page_size)
        selector = validation.validate_labels(label_selector)
        bound = f"volumes {sorted(selector.items())!r} {tenancy.current()!r}"
        after = paging.decode_token(page_token, checks.is_volume_id, bound)
        found = await self._store.page(tenancy.current(), after, size + 1, selector)
        token = ""
        if len(found) > size:
            found = found[:size]
            token = paging.encode_token(found[-1].volume_id, bound)
        # A listing shows the usage last measured: measuring runs a container per disk.
        return [await self._view(r, measure=False) for r in found], token

    async def _view(self, record: VolumeRecord, *, measure: bool = True) -> Volume:
        used = record.used_bytes
        if measure:
            try:
                used = await self._disks.disk_used_bytes(record.disk)
            except SandboxError as exc:  # the volume is shown with its last figure
                log.info("volume %s: usage unknown: %s", record.volume_id, exc)
            else:
                await self._store.set_used(record.tenant, record.volume_id, used)
        attached = tuple(await self._claims.users(record.volume_id))
        return Volume(record, used, attached)

    # ----- delete, export, import --------------------------------------------------------

    async def delete(self, volume_id: str) -> bool:
        """Whether this call removed it; refused while a live session mounts it."""
        checks.validate_volume_id(volume_id)
        tenant = tenancy.current()
        async with self._claims.locked([volume_id]):
            record = await self._store.get(tenant, volume_id)
            if record is None:
                self._observer.emit(domain_events.VolumeDeleted(tenant, volume_id, existed=False))
                return False
            why = "delete the session first (or wait for its lease to end)"
            await self._claims.require_unmounted(volume_id, why, readers_ok=False)
            await self._store.delete(tenant, volume_id)
            await self._remove_disk(record.disk)  # a failure is the sweep's to finish
        log.info("volume deleted", extra={"volume_id": volume_id})
        self._observer.emit(domain_events.VolumeDeleted(tenant, volume_id, existed=True))
        return True

    async def export(self, volume_id: str) -> AsyncIterator[bytes]:
        """The volume's tar; refused while a session writes it (the archive would tear)."""
        checks.validate_volume_id(volume_id)
        porter = self._require_porter()
        async with self._claims.locked([volume_id]):
            record = await self._claims.record(volume_id)
            why = "an export while it is written would not be one state of it"
            await self._claims.require_unmounted(volume_id, why, readers_ok=True)
            chunks = porter.export(record.disk, record.size_bytes)
            sent = 0
            async with contextlib.aclosing(chunks):  # type: ignore[type-var]
                async for data in chunks:
                    sent += len(data)
                    yield data
        self._observer.emit(
            domain_events.VolumeMoved(tenancy.current(), volume_id, imported=False, tar_bytes=sent)
        )

    async def import_(self, volume_id: str, replace: bool, chunks: AsyncIterator[bytes]) -> Volume:
        """All or nothing, checked as ImportArchive; refused while any session mounts it."""
        checks.validate_volume_id(volume_id)
        porter = self._require_porter()
        async with self._claims.locked([volume_id]):
            record = await self._claims.record(volume_id)
            why = "an import changes what its sessions see under them; delete them first"
            await self._claims.require_unmounted(volume_id, why, readers_ok=False)
            taken = [0]

            async def counted() -> AsyncIterator[bytes]:
                async for data in chunks:
                    taken[0] += len(data)
                    yield data

            await porter.import_(record.disk, record.size_bytes, replace, counted())
            volume = await self._view(record)
        self._observer.emit(
            domain_events.VolumeMoved(tenancy.current(), volume_id, True, taken[0], replace)
        )
        return volume

    def _require_porter(self) -> VolumePorter:
        if self._porter is None:
            raise Internal("this server was built without a volume porter")
        return self._porter

    # ----- disks ------------------------------------------------------------------------

    async def _remove_disk(self, disk: str) -> None:
        try:
            await self._disks.remove_disk(disk)
        except SandboxError as exc:
            log.warning("volume disk %s not removed (the sweep retries): %s", disk, exc)

    async def kept_disks(self) -> set[str]:
        """Every disk a volume owns or a create is making: what no sweep may remove."""
        return await self._store.disks() | set(self._making)

    async def sweep(self) -> int:
        """Remove this server's volume disks that no record holds (a crash between a disk and
        its record, a removal that failed); how many it removed."""
        if self._porter is not None:
            await self._porter.sweep()  # first: a dead porter mounts the disk it moved
        names = await self._disks.list_disks(self._prefix)
        keep = await self.kept_disks()
        removed = 0
        for name in names:
            if name in keep or name in self._making:
                continue
            await self._remove_disk(name)
            removed += 1
        return removed
