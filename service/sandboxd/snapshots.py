"""Server-side snapshots of workspaces: create, look up, list, delete, download, restore.

A snapshot is the tar `ArchiveIO.export` streams, written to disk as it arrives and named by
its sha256 (see snapshot_store). Snapshots are taken when a caller asks (CreateSnapshot) and
automatically when a session is suspended; a container that is lost is rebuilt from the
session's latest one. Restoring goes through the same checked import as any caller's archive:
a snapshot's content came from an untrusted workspace.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
import secrets
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

from sandboxd import tenancy, validation
from sandboxd.archive import ArchiveIO
from sandboxd.engine import Engine
from sandboxd.errors import InvalidArgument, NotFound, SandboxError
from sandboxd.models import Session, SessionState
from sandboxd.profile import LABEL_OWNER, LABEL_SESSION
from sandboxd.sessions import SessionManager
from sandboxd.snapshot_store import Snapshot, SnapshotStore
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)

KIND_TAR = "TAR"
KIND_IMAGE = "IMAGE"
AUTO_LABEL = "io.sandboxd.auto"  # set on snapshots the server takes by itself
AUTO_KEEP = 2  # automatic snapshots kept per session (the newest)
SHUTDOWN_PARALLEL = 2  # snapshots taken at once at shutdown (2 cores: more only queues)
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100
_ID_RE = re.compile(r"\Asnap-[0-9a-f]{16}\Z")
IMAGE_REPOSITORY = "sandboxd-snapshot"
LABEL_SNAPSHOT = "io.sandboxd.snapshot"


def _not_found(snapshot_id: str) -> NotFound:
    return NotFound(
        f"snapshot {snapshot_id[:80]!r} not found",
        reason="SNAPSHOT_NOT_FOUND",
        metadata={"snapshot_id": snapshot_id[:80]},
    )


class Snapshots:
    """The SnapshotService's domain, and the workspace keeper SessionManager calls on."""

    def __init__(
        self,
        store: SnapshotStore,
        archive: ArchiveIO,
        sessions: SessionManager,
        engine: Engine,
        session_store: SessionStore,
    ) -> None:
        self._session_store = session_store
        self._store = store
        self._archive = archive
        self._sessions = sessions
        self._engine = engine
        sessions.snapshots = self

    # ----- lookup: the one place visibility is decided ----------------------------------

    async def lookup(self, snapshot_id: str) -> Snapshot:
        """The snapshot if the caller may see it; NOT_FOUND otherwise, whoever owns it."""
        if not _ID_RE.match(snapshot_id):
            raise _not_found(snapshot_id)
        snap = await self._store.get(snapshot_id)
        if snap is None or snap.tenant != tenancy.current():
            raise _not_found(snapshot_id)
        return snap

    # ----- API --------------------------------------------------------------------------

    async def create(self, session_id: str, labels: Mapping[str, str], kind: str) -> Snapshot:
        if kind not in ("", KIND_TAR, KIND_IMAGE):
            raise InvalidArgument(
                f"snapshot kind {kind!r} is not one this server knows; use TAR or IMAGE",
                reason="SNAPSHOT_KIND_UNSUPPORTED",
            )
        checked = validation.validate_labels(labels)
        async with self._sessions.use(session_id) as session:
            return await self.take(session, checked, image=kind == KIND_IMAGE)

    async def get(self, snapshot_id: str) -> Snapshot:
        return await self.lookup(snapshot_id)

    async def list(
        self, session_id: str, page_size: int, page_token: str
    ) -> tuple[list[Snapshot], str]:
        if page_size < 0:
            raise InvalidArgument("page_size must not be negative", reason="INVALID_PAGE_SIZE")
        if session_id:
            await self._sessions.get(session_id)  # NOT_FOUND for a missing or hidden session
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        after = _decode_token(page_token)
        found: list[Snapshot] = []
        while len(found) <= size:
            batch = await self._store.page(session_id=session_id, after=after, limit=size + 1)
            found += [s for s in batch if s.tenant == tenancy.current()]
            if len(batch) < size + 1:
                break
            after = batch[-1].snapshot_id
        token = ""
        if len(found) > size:
            found = found[:size]
            token = base64.urlsafe_b64encode(found[-1].snapshot_id.encode()).decode()
        return found, token

    async def delete(self, snapshot_id: str) -> None:
        try:
            snap = await self.lookup(snapshot_id)
        except NotFound:
            return  # idempotent
        await self._delete(snap.snapshot_id)
        log.info("snapshot deleted", extra={"snapshot_id": snapshot_id})

    async def _delete(self, snapshot_id: str) -> None:
        snap = await self._store.delete(snapshot_id)
        if snap is not None and snap.image:
            await self._remove_image(snap.image)

    async def _remove_image(self, image: str) -> bool:
        """Remove a snapshot's image; a removal Docker refuses is remembered and retried by
        the sweeper, never forgotten. True when the image is gone."""
        try:
            await self._engine.remove_image(image)
        except SandboxError as exc:
            log.warning("image %s not removed yet (%s); the sweeper retries", image[:19], exc)
            await self._store.add_pending_image(image)
            return False
        return True

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
        for found in await self._engine.list_images({LABEL_OWNER: self._sessions.owner_id}):
            image_id = str(found.get("Id", ""))
            if image_id and not await self._store.image_in_use(image_id):
                if await self._remove_image(image_id):
                    removed += 1
        return removed

    async def download(self, snapshot_id: str) -> AsyncIterator[bytes]:
        snap = await self.lookup(snapshot_id)
        try:
            async for chunk in self._store.read(snap.sha256):
                yield chunk
        except FileNotFoundError:
            raise _not_found(snapshot_id) from None

    # ----- used by SessionManager -------------------------------------------------------

    async def take(
        self, session: Session, labels: Mapping[str, str], *, image: bool = False
    ) -> Snapshot:
        """Snapshot a running session's workspace now (and commit its container for IMAGE:
        the workspace is a tmpfs, which a commit does not hold, so the tar is taken too)."""
        snap = Snapshot(
            snapshot_id="snap-" + secrets.token_hex(8),
            session_id=session.session_id,
            sha256="",
            size_bytes=0,
            created_at=datetime.now(tz=UTC),
            kind=KIND_IMAGE if image else KIND_TAR,
            labels=dict(labels),
            tenant=session.tenant,
        )
        if image:
            snap.image = await self._engine.commit_container(
                session.container_id,
                IMAGE_REPOSITORY,
                f"{self._sessions.owner_id.lower()}-{snap.snapshot_id}",
                {
                    LABEL_OWNER: self._sessions.owner_id,
                    LABEL_SESSION: session.session_id,
                    LABEL_SNAPSHOT: snap.snapshot_id,
                },
            )
        try:
            await self._store.add(self._archive.export(session, "."), snap)
        except BaseException:
            if snap.image:
                await asyncio.shield(self._remove_image(snap.image))
            raise
        log.info(
            "snapshot taken",
            extra={"session_id": session.session_id, "snapshot_id": snap.snapshot_id},
        )
        if AUTO_LABEL in labels:
            await self._prune_auto(session.session_id)
        return snap

    async def snapshot_running(self, budget_s: float, abort: asyncio.Event) -> int:
        """At shutdown: snapshot every running session, within `budget_s`, until `abort`."""
        running = [s for s in await self._session_store.all() if s.state is SessionState.RUNNING]
        if not running:
            return 0
        log.info("snapshotting %d running session(s) before exit", len(running))
        gate = asyncio.Semaphore(SHUTDOWN_PARALLEL)
        taken = 0

        async def one(session: Session) -> None:
            nonlocal taken
            async with gate:
                try:
                    await self.take(session, {AUTO_LABEL: "shutdown"})
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

    async def _prune_auto(self, session_id: str) -> None:
        auto = [s for s in await self._store.of_session(session_id) if AUTO_LABEL in s.labels]
        for old in auto[:-AUTO_KEEP]:
            await self._delete(old.snapshot_id)

    async def latest(self, session_id: str) -> Snapshot | None:
        return await self._store.latest(session_id)

    async def restore(self, session: Session, snap: Snapshot) -> None:
        """Replace the (fresh) container's workspace with the snapshot's content."""
        await self._archive.import_(session, ".", True, self._store.read(snap.sha256))

    async def adopt(self, snap: Snapshot, session: Session) -> Snapshot:
        """A fork's own record of the snapshot it started from (same tar, no copy), so the
        fork can be rebuilt before it takes a snapshot of its own."""
        own = Snapshot(
            snapshot_id="snap-" + secrets.token_hex(8),
            session_id=session.session_id,
            sha256=snap.sha256,
            size_bytes=snap.size_bytes,
            created_at=datetime.now(tz=UTC),
            kind=KIND_TAR,
            labels={AUTO_LABEL: "fork", "io.sandboxd.forked-from": snap.snapshot_id},
            tenant=session.tenant,
        )
        await self._store.insert(own)
        return own

    async def forget_session(self, session_id: str) -> None:
        for snap in await self._store.of_session(session_id):
            try:
                await self._delete(snap.snapshot_id)
            except (SandboxError, OSError) as exc:
                log.warning("could not delete snapshot %s: %s", snap.snapshot_id, exc)


def _decode_token(token: str) -> str:
    if not token:
        return ""
    try:
        value = base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        value = ""
    if not _ID_RE.match(value):
        raise InvalidArgument(
            "page_token is not one this server issued", reason="INVALID_PAGE_TOKEN"
        )
    return value
