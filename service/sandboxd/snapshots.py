"""Server-side snapshots of workspaces: create, look up, list, delete, download, restore.

A snapshot is the tar `ArchiveIO.export` streams, written to disk as it arrives and named by
its sha256 (see snapshot_store); a disk workspace's is a copy of its disk the engine host keeps
(disk_snapshots.py), unless a tar is asked for. Snapshots are taken when a caller asks
(CreateSnapshot) and automatically when a session is suspended; a container that is lost is
rebuilt from the session's latest one. Restoring goes through the same checked import as any
caller's archive: a snapshot's content came from an untrusted workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from sandboxd import domain_events, paging, tenancy, validation
from sandboxd.engine.protocol import Engine
from sandboxd.errors import (
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SandboxError,
    SessionNotFound,
)
from sandboxd.models import Session, SessionState
from sandboxd.reasons import Reason
from sandboxd.sessions import SessionManager
from sandboxd.snapshot_keeper import (
    AUTO_LABEL,
    KIND_IMAGE,
    KIND_TAR,
    SHUTDOWN_PARALLEL,
    SnapshotKeeper,
    WorkspaceArchive,
    _is_snapshot_id,
    _not_found,
    _not_tar,
)
from sandboxd.snapshot_store import KIND_DISK, Snapshot, SnapshotStore
from sandboxd.store import SessionStore
from sandboxd.templates.quota import ImageQuota
from sandboxd.volumes.disk_quota import DiskQuota

__all__ = [  # the keeper's names, read from here by the API's side and the server
    "AUTO_LABEL",
    "KIND_IMAGE",
    "KIND_TAR",
    "SnapshotKeeper",
    "Snapshots",
    "WorkspaceArchive",
]

log = logging.getLogger(__name__)


class Snapshots:
    """The SnapshotService's domain: create, look up, list, delete, download, sweep."""

    def __init__(
        self,
        keeper: SnapshotKeeper,
        store: SnapshotStore,
        sessions: SessionManager,
        engine: Engine,
        session_store: SessionStore,
        *,
        quota: ImageQuota,
        max_image_bytes: int,
        observer: domain_events.Observer = domain_events.SILENT,  # snapshots taken, deleted
        disk_quota: DiskQuota | None = None,  # None: no tenant_max_disk_bytes
    ) -> None:
        self._observer = observer
        self._disk_quota = disk_quota
        self._quota = quota
        self._max_image_bytes = max_image_bytes
        self._keeper = keeper
        self._store = store
        self._sessions = sessions
        self._engine = engine
        self._session_store = session_store

    async def create(
        self, session_id: str, labels: Mapping[str, str], kind: str, *, resume: bool = True
    ) -> Snapshot:
        """A snapshot of the session's workspace; `resume` False: refused for a suspended
        session rather than waking it (the server's checkpoints)."""
        if kind not in ("", KIND_TAR, KIND_IMAGE, KIND_DISK):
            raise InvalidArgument(
                f"snapshot kind {kind!r} is not one this server knows; use TAR, IMAGE or DISK",
                reason=Reason.SNAPSHOT_KIND_UNSUPPORTED,
            )
        checked = validation.validate_labels(labels)
        image = kind == KIND_IMAGE
        if image:
            await self._quota.check_room(tenancy.current(), "an image snapshot")
        if self._disk_quota is not None:  # any room at all; its size is known once taken
            await self._disk_quota.check(tenancy.current(), 1, "a snapshot")
        # Exclusive: no file call or import is half-way through the tree it takes.
        async with self._sessions.use(session_id, exclusive=True, resume=resume) as session:
            if kind == KIND_DISK and not session.spec.on_disk:
                raise InvalidArgument(
                    f"session {session_id!r} has a memory workspace: a DISK snapshot copies a "
                    "disk workspace; use TAR or IMAGE",
                    reason=Reason.SNAPSHOT_KIND_UNSUPPORTED,
                )
            snap = await self._keeper.take(session, checked, image=image, tar=kind == KIND_TAR)
        if image:
            await self._keep_within_limits(snap)
        await self._keep_within_disk_quota(snap)
        # A DeleteSession that ran meanwhile forgot the session's snapshots before this one
        # was recorded: check under the session's lock, and take back an orphan.
        async with self._sessions.locked(session_id):
            if not await self._sessions.is_current(session):
                await self._keeper.delete(snap.snapshot_id)
                raise SessionNotFound(session_id)
        self._observer.emit(
            domain_events.SnapshotTaken(
                snap.tenant, session_id, snap.snapshot_id, snap.size_bytes, snap.sha256, snap.image
            )
        )
        return snap

    async def _keep_within_disk_quota(self, snap: Snapshot) -> None:
        """The snapshot against the tenant's disk quota, now that its size is known: over
        it, the snapshot is taken back and refused (nothing of it stays)."""
        quota = self._disk_quota
        if quota is None or not quota.limit_bytes:
            return
        used = await quota.used(snap.tenant)
        if used > quota.limit_bytes:
            await asyncio.shield(self._keeper.delete(snap.snapshot_id))
            raise quota.refused(snap.tenant, used - snap.size_bytes, snap.size_bytes, "a snapshot")

    async def _keep_within_limits(self, snap: Snapshot) -> None:
        """The committed image against max_image_bytes and the tenant's image quota (its
        size is known only now): over either, the snapshot is taken back and refused."""
        details = await self._engine.inspect_image(snap.image)
        size = details.size_bytes if details is not None else 0
        refusal: SandboxError | None = None
        if size > self._max_image_bytes:
            refusal = ResourceExhausted(
                f"the snapshot's image is {size} bytes, over this server's limit of "
                f"{self._max_image_bytes} (setting max_image_bytes)",
                reason=Reason.IMAGE_TOO_LARGE,
                metadata={"limit_bytes": str(self._max_image_bytes), "size_bytes": str(size)},
            )
        elif await self._quota.room(snap.tenant) - self._quota.running(snap.tenant) < 0:
            refusal = self._quota.refused(f"an image snapshot of {size} bytes")
        if refusal is not None:
            await asyncio.shield(self._keeper.delete(snap.snapshot_id))
            raise refusal

    async def get(self, snapshot_id: str) -> Snapshot:
        return await self._keeper.lookup(snapshot_id)

    async def list(
        self,
        session_id: str,
        page_size: int,
        page_token: str,
        label_selector: Mapping[str, str] | None = None,
    ) -> tuple[list[Snapshot], str]:
        size = paging.page_size(page_size)
        if session_id:
            await self._sessions.get(session_id)  # NOT_FOUND for a missing or hidden session
        selector = validation.validate_labels(label_selector or {})
        bound = f"snapshots {session_id} {sorted(selector.items())!r} {tenancy.current()!r}"
        after = paging.decode_token(page_token, _is_snapshot_id, bound)
        found: list[Snapshot] = []
        while len(found) <= size:
            batch = await self._store.page(session_id=session_id, after=after, limit=size + 1)
            found += [
                s
                for s in batch
                if s.tenant == tenancy.current()
                and all(s.labels.get(k) == v for k, v in selector.items())
            ]
            if len(batch) < size + 1:
                break
            after = batch[-1].snapshot_id
        token = ""
        if len(found) > size:
            found = found[:size]
            token = paging.encode_token(found[-1].snapshot_id, bound)
        return found, token

    async def delete(self, snapshot_id: str) -> None:
        try:
            snap = await self._keeper.lookup(snapshot_id)
        except NotFound:
            # Idempotent: the call is recorded all the same, as it was asked.
            self._observer.emit(domain_events.SnapshotDeleted(tenancy.current(), snapshot_id))
            return
        await self._keeper.delete(snap.snapshot_id)
        log.info("snapshot deleted", extra={"snapshot_id": snapshot_id})
        self._observer.emit(domain_events.SnapshotDeleted(snap.tenant, snapshot_id))

    async def sweep_disks(self) -> int:
        """Remove the snapshot disks no record holds (disk_snapshots.py)."""
        return await self._keeper.disks.sweep()

    async def sweep_images(self) -> int:
        """Retry refused removals; remove images of this server that no snapshot claims."""
        removed = 0
        for image in await self._store.pending_images():
            if await self._store.image_in_use(image):
                await self._store.drop_pending_image(image)  # claimed again: keep it
                continue
            try:
                await self._engine.remove_image(image)
            except SandboxError as exc:
                log.info("image %s still not removable: %s", image[:19], exc)
                continue
            await self._store.drop_pending_image(image)
            removed += 1
        for image_id in await self._engine.list_images(self._sessions.owner_id):
            if not await self._store.image_in_use(image_id):
                if await self._keeper.remove_image(image_id):
                    removed += 1
        return removed

    async def download(self, snapshot_id: str) -> AsyncIterator[bytes]:
        snap = await self._keeper.lookup(snapshot_id)
        if snap.kind == KIND_DISK:
            raise _not_tar(snapshot_id)
        try:
            async with contextlib.aclosing(self._store.read(snap.sha256)) as chunks:
                async for chunk in chunks:
                    yield chunk
        except FileNotFoundError:
            raise _not_found(snapshot_id) from None

    async def snapshot_running(self, budget_s: float, abort: asyncio.Event) -> int:
        """At shutdown: snapshot every running session, within `budget_s`, until `abort`."""
        # A disk workspace stays where it is (a restarted server rebuilds on it): no copy.
        running = [
            s
            for s in await self._session_store.all()
            if s.state is SessionState.RUNNING and not s.spec.on_disk
        ]
        if not running:
            return 0
        log.info("snapshotting %d running session(s) before exit", len(running))
        gate = asyncio.Semaphore(SHUTDOWN_PARALLEL)
        taken = 0

        async def one(session: Session) -> None:
            nonlocal taken
            async with gate:
                try:
                    await self._keeper.take(session, {AUTO_LABEL: "shutdown"})
                    taken += 1
                except SandboxError as exc:
                    log.warning("shutdown snapshot of %s failed: %s", session.session_id, exc)

        work = asyncio.gather(*(one(s) for s in running))
        stop = asyncio.ensure_future(abort.wait())
        waiting: list[asyncio.Future[Any]] = [work, stop]
        await asyncio.wait(waiting, timeout=budget_s, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not work.done():
            work.cancel()
            log.warning("shutdown: %d of %d session(s) snapshotted in time", taken, len(running))
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return taken
