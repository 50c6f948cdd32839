"""A volume's content in and out as tar streams, through the server's one tar transfer.

Export and import reuse sandboxd.archive.transfer as they are (ExportArchive's stream and its
cap, ImportArchive's member checks, staging and all-or-nothing merge) inside a porter: a
short-lived sandbox of the runtime image with the server's hardened profile, the volume's disk
at /workspace in place of the tmpfs, running as a host uid held for the porter alone (the
volume is handed to it first, so every file is readable and the import's files are owned as
the next writer will have them again). Porters carry an owner id of their own, so no session's
reconcile takes one for a leftover mid-transfer; `sweep` removes those a dead server left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from sandboxd import tenancy
from sandboxd.archive import ArchiveIO
from sandboxd.engine.protocol import Engine, SandboxRequest
from sandboxd.host_ids import HostIds
from sandboxd.models import (
    Limits,
    NetworkPolicy,
    Session,
    SessionSpec,
    SessionState,
    ShellPolicy,
    VolumeMount,
    WorkspaceManifest,
)
from sandboxd.volumes.port import VolumeDisks

log = logging.getLogger(__name__)


class SandboxPorter:
    def __init__(
        self,
        engine: Engine,
        archive: ArchiveIO,
        disks: VolumeDisks,
        host_ids: HostIds,
        *,
        owner_id: str,
        image: str,
        limits: Limits,
        running: set[str] | None = None,
    ) -> None:
        self._engine = engine
        self._archive = archive
        self._disks = disks
        self._host_ids = host_ids
        self.owner_id = f"{owner_id}-porter"
        self._image = image
        self._limits = limits
        # Porters and volume hand-overs in flight (shared with the engine's VolumeDisks).
        self._running = running if running is not None else set()

    @contextlib.asynccontextmanager
    async def _porter(self, disk: str, size_bytes: int, read_only: bool) -> AsyncIterator[Session]:
        async with self._host_ids.holding() as uid:
            await self._disks.own_disk(disk, uid, uid)
            # A volume's file may be as large as the volume; the stream is capped by its size.
            limits = dataclasses.replace(
                self._limits, workspace_bytes=size_bytes, file_bytes=size_bytes
            )
            spec = SessionSpec(
                image=self._image,
                limits=limits,
                shell=ShellPolicy(),
                network=NetworkPolicy(),
                env={},
                uid=uid,
                gid=uid,
                manifest=WorkspaceManifest(),
                volumes=(VolumeMount("", "/workspace", read_only, disk),),
            )
            name = f"porter-{secrets.token_hex(6)}"
            now = datetime.now(UTC)
            session = Session(
                session_id=name,
                spec=spec,
                fingerprint="",
                state=SessionState.RUNNING,
                created_at=now,
                lease_expires_at=now + timedelta(hours=1),
                tenant=tenancy.current(),
            )
            request = SandboxRequest(
                spec=spec,
                owner_id=self.owner_id,
                name=f"sandboxd-{self.owner_id}-{name}",
                session_id=name,
            )
            sandbox_id = await self._engine.create_sandbox(request)
            self._running.add(sandbox_id)
            try:
                await self._engine.start_sandbox(sandbox_id)
                session.container_id = sandbox_id
                yield session
            finally:
                self._running.discard(sandbox_id)
                await self._engine.remove_sandbox(sandbox_id)

    async def export(self, disk: str, size_bytes: int) -> AsyncIterator[bytes]:
        async with self._porter(disk, size_bytes, read_only=True) as porter:
            chunks = self._archive.export(porter, ".")
            async with contextlib.aclosing(chunks):  # type: ignore[type-var]
                async for data in chunks:
                    yield data

    async def import_(
        self, disk: str, size_bytes: int, replace: bool, chunks: AsyncIterator[bytes]
    ) -> None:
        async with self._porter(disk, size_bytes, read_only=False) as porter:
            await self._archive.import_(porter, ".", replace, chunks)

    async def sweep(self) -> int:
        """Remove porters a dead server left (none of this one's in flight)."""
        removed = 0
        for found in await self._engine.list_sandboxes(self.owner_id):
            if found.sandbox_id not in self._running:
                await self._engine.remove_sandbox(found.sandbox_id)
                removed += 1
        return removed
