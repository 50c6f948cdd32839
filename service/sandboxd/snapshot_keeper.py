"""The keeper of snapshots that sessions get (sessions/keeper.py is its protocol): take one
when a session is suspended or asks, find a session's latest, restore it into a rebuilt
sandbox, forget a session's, and the names and refusals snapshots share with the API's side
(snapshots.py, `Snapshots`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from sandboxd import images, tenancy
from sandboxd.disk_snapshots import DiskSnapshots
from sandboxd.engine.protocol import Engine
from sandboxd.errors import (
    FailedPrecondition,
    NotFound,
    SandboxError,
)
from sandboxd.labels import (
    LABEL_AUTO,
    LABEL_FORKED_FROM,
    LABEL_OWNER,
    LABEL_SESSION,
    LABEL_SNAPSHOT,
)
from sandboxd.models import Session
from sandboxd.reasons import Reason
from sandboxd.snapshot_store import (
    KIND_DISK,
    KIND_MEMORY,
    Snapshot,
    SnapshotStore,
    new_snapshot,
)

log = logging.getLogger(__name__)

KIND_TAR = "TAR"
KIND_IMAGE = "IMAGE"
AUTO_LABEL = LABEL_AUTO  # set on snapshots the server takes by itself
AUTO_KEEP = 2  # automatic snapshots kept per session (the newest)
SHUTDOWN_PARALLEL = 2  # snapshots taken at once at shutdown (2 cores: more only queues)
_ID_RE = re.compile(r"\Asnap-[0-9a-f]{16}\Z")
IMAGE_REPOSITORY = images.SNAPSHOT_REPOSITORY


class WorkspaceArchive(Protocol):
    """What snapshots need of sandboxd.archive.ArchiveIO: a workspace out as a tar stream,
    and a checked tar stream in."""

    def export(self, session: Session, path: str) -> AsyncIterator[bytes]: ...

    async def import_(
        self,
        session: Session,
        path: str,
        replace: bool,
        chunks: AsyncIterator[bytes],
        *,
        trusted: bool = False,
    ) -> Any: ...

    async def tidy(self, session: Session) -> None: ...

    async def check_restorable(self, session: Session, chunks: AsyncIterator[bytes]) -> None: ...


def _not_found(snapshot_id: str) -> NotFound:
    return NotFound(
        f"snapshot {snapshot_id[:80]!r} not found",
        reason=Reason.SNAPSHOT_NOT_FOUND,
        metadata={"snapshot_id": snapshot_id[:80]},
    )


def _not_tar(snapshot_id: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"snapshot {snapshot_id} is a disk snapshot kept on the engine host, not a tar: take "
        "a snapshot of kind TAR to download it or to fork it into a memory workspace",
        reason=Reason.SNAPSHOT_NOT_TAR,
        metadata={"snapshot_id": snapshot_id},
    )


def _is_snapshot_id(value: str) -> bool:
    return bool(_ID_RE.match(value))


class SnapshotKeeper:
    """The workspace keeper sessions call on (suspend, resume, fork, lost sandboxes): built
    before the SessionManager and passed to it (see sandboxd.sessions.keeper)."""

    def __init__(
        self, store: SnapshotStore, archive: WorkspaceArchive, engine: Engine, owner_id: str
    ) -> None:
        self._store = store
        self._archive = archive
        self._engine = engine
        self._owner_id = owner_id
        self.disks = DiskSnapshots(engine, store)

    async def images_of(self, tenant: str) -> list[str]:
        return await self._store.images_of(tenant)

    async def lookup(self, snapshot_id: str) -> Snapshot:
        """The snapshot if the caller may see it; NOT_FOUND otherwise, whoever owns it.
        The one place visibility is decided."""
        if not _is_snapshot_id(snapshot_id):
            raise _not_found(snapshot_id)
        snap = await self._store.get(snapshot_id)
        if snap is None or snap.tenant != tenancy.current() or snap.kind == KIND_MEMORY:
            raise _not_found(snapshot_id)
        return snap

    async def take(
        self,
        session: Session,
        labels: Mapping[str, str],
        *,
        image: bool = False,
        tar: bool = False,
    ) -> Snapshot:
        """Snapshot a running session's workspace now (and commit its sandbox for IMAGE:
        the workspace is a tmpfs, which a commit does not hold, so the tar is taken too).
        A disk workspace's is a copy of its disk on the engine host unless `tar` or IMAGE
        asks for the tar."""
        kind = KIND_IMAGE if image else KIND_TAR
        snap = new_snapshot(session.session_id, session.tenant, kind, labels)
        if session.spec.on_disk and not (image or tar):
            await self.disks.take(session, snap)
            taken = "disk snapshot taken"
        else:
            await self._take_tar(session, snap)
            taken = "snapshot taken"
        log.info(taken, extra={"session_id": session.session_id, "snapshot_id": snap.snapshot_id})
        if AUTO_LABEL in labels:
            await self._prune_auto(session.session_id)
        return snap

    async def _take_tar(self, session: Session, snap: Snapshot) -> None:
        """The workspace's tar into the store (after the sandbox's commit for IMAGE), checked
        restorable; a failure leaves neither record nor image behind."""
        if snap.kind == KIND_IMAGE:
            snap.image = await self._engine.commit_sandbox(
                session.container_id,
                IMAGE_REPOSITORY,
                f"{self._owner_id.lower()}-{snap.snapshot_id}",
                {
                    LABEL_OWNER: self._owner_id,
                    LABEL_SESSION: session.session_id,
                    LABEL_SNAPSHOT: snap.snapshot_id,
                },
            )
        try:
            await self._store.add(self._archive.export(session, "."), snap)
        except BaseException:
            if snap.image:
                await asyncio.shield(self.remove_image(snap.image))
            raise
        try:
            # Refused now, while the session runs, rather than found out at Resume. aclosing:
            # the check may stop reading early, and the tar's file must close now, not at GC.
            async with contextlib.aclosing(self._store.read(snap.sha256)) as reader:
                await self._archive.check_restorable(session, reader)
        except BaseException:
            await asyncio.shield(self.delete(snap.snapshot_id))
            raise

    async def _prune_auto(self, session_id: str) -> None:
        auto = [s for s in await self._store.of_session(session_id) if AUTO_LABEL in s.labels]
        for old in auto[:-AUTO_KEEP]:
            await self.delete(old.snapshot_id)

    async def latest(self, session_id: str) -> Snapshot | None:
        """The newest snapshot a lost workspace can be rebuilt from: a disk snapshot only
        while its copy is on the engine host (a host that lost its volumes lost those too)."""
        for snap in reversed(await self._store.of_session(session_id)):
            if snap.kind == KIND_MEMORY:
                continue
            if snap.kind != KIND_DISK or await self._engine.disks.exists(snap.disk):
                return snap
        return None

    async def restore(self, session: Session, snap: Snapshot) -> None:
        """Replace the (fresh) sandbox's workspace with the snapshot's content. A disk
        snapshot's content is the disk the sandbox was made on already (a fork's copy,
        sessions/sandboxes.py): nothing to do here."""
        if snap.kind == KIND_DISK:
            if session.spec.disk_id and snap.disk:
                return
            raise _not_tar(snap.snapshot_id)
        # aclosing: a refused restore stops reading early; the tar's file closes now.
        async with contextlib.aclosing(self._store.read(snap.sha256)) as reader:
            await self._archive.import_(session, ".", True, reader, trusted=True)

    async def adopt(self, snap: Snapshot, session: Session) -> Snapshot:
        """A fork's own record of the snapshot it started from (same tar, no copy), so the
        fork can be rebuilt before it takes a snapshot of its own. A disk snapshot's fork
        has a disk of its own, which a lost container is rebuilt on: no record to adopt."""
        if snap.kind == KIND_DISK:
            return snap
        labels = {AUTO_LABEL: "fork", LABEL_FORKED_FROM: snap.snapshot_id}
        own = new_snapshot(
            session.session_id,
            session.tenant,
            KIND_TAR,
            labels,
            sha256=snap.sha256,
            size_bytes=snap.size_bytes,
        )
        await self._store.insert(own)
        return own

    async def tidy(self, session: Session) -> None:
        await self._archive.tidy(session)

    async def forget_session(self, session_id: str) -> None:
        for snap in await self._store.of_session(session_id):
            try:
                await self.delete(snap.snapshot_id)
            except (SandboxError, OSError) as exc:
                log.warning("could not delete snapshot %s: %s", snap.snapshot_id, exc)

    async def delete(self, snapshot_id: str) -> None:
        snap = await self._store.delete(snapshot_id)
        if snap is not None and snap.image:
            await self.remove_image(snap.image)
        if snap is not None and snap.disk:
            await self.disks.forget(snap)

    async def remove_image(self, image: str) -> bool:
        """Remove a snapshot's image; a removal Docker refuses is remembered and retried by
        the sweeper, never forgotten. True when the image is gone."""
        try:
            await self._engine.remove_image(image)
        except SandboxError as exc:
            log.warning("image %s not removed yet (%s); the sweeper retries", image[:19], exc)
            await self._store.add_pending_image(image)
            return False
        return True
