"""The session domain wired as server/main.py wires it, over the in-memory engine fake (or a given
engine and archive: the real ones, in the contract tests) and a SQLite store in a temporary
directory: what the Docker-free lifecycle tests run against."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from fakes import FakeArchive, FakeCommands, FakeEngine
from sandboxd import tenancy
from sandboxd.config import Config
from sandboxd.host_ids import HostIds
from sandboxd.pool import WarmPool
from sandboxd.sessions import SessionManager
from sandboxd.sessions.memory_suspension import MemoryOptions
from sandboxd.snapshot_store import SnapshotStore
from sandboxd.snapshots import SnapshotKeeper, Snapshots
from sandboxd.store import SessionStore
from sandboxd.templates.quota import ImageQuota
from sandboxd.templates.store import TemplateStore
from sandboxd.volumes.disk_quota import DiskQuota
from sandboxd.volumes.store import VolumeStore

OWNER = "sbxunit"
T = TypeVar("T")


@dataclass
class Stack:
    engine: Any  # a FakeEngine unless the test gave another
    commands: Any  # FakeCommands over it unless the test gave others
    store: SessionStore
    snap_store: SnapshotStore
    archive: Any  # a FakeArchive unless the test gave another
    sessions: SessionManager
    snapshots: Snapshots
    pool: WarmPool | None
    owner: str = OWNER
    ended: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)  # memory resumes (processes adopted)
    volumes: Any = None  # the volume claims, when session_stack was given `volumes`
    disk_quota: DiskQuota | None = None  # tenant_max_disk_bytes over this stack's records

    async def backdate_lease(self, session_id: str, by: timedelta) -> None:
        """Move a lease into the past, as if time had passed."""
        session = await self.store.get(session_id)
        assert session is not None
        session.lease_expires_at = datetime.now(tz=UTC) - by
        await self.store.update(session)


@contextlib.asynccontextmanager
async def session_stack(
    tmp_path: Path,
    *,
    pool_size: int = 0,
    engine: Any = None,
    commands: Any = None,
    archive: Callable[[Any], Any] | None = None,
    owner: str = OWNER,
    tiers: Any = None,
    egress: Any = None,
    volumes: Callable[[SessionStore], Awaitable[Any]] | None = None,
    observer: Any = None,
    **settings: Any,
) -> AsyncIterator[Stack]:
    """`volumes`: builds the volume claims over the store (sandboxd.volumes), when the test
    mounts volumes; the stack's `volumes` is what it built. `observer`: where the sessions and
    snapshots emit their domain events (none listens by default)."""
    config = dataclasses.replace(Config(data_dir=tmp_path, pool_size=pool_size), **settings)
    engine = engine if engine is not None else FakeEngine()
    commands = commands if commands is not None else FakeCommands(engine)
    async with SessionStore(tmp_path / "sessions.db") as store:
        snap_store = await SnapshotStore(store.db, tmp_path / "snapshots").open()
        workspace = archive(engine) if archive is not None else FakeArchive(engine)
        keeper = SnapshotKeeper(snap_store, workspace, engine, owner)
        host_ids = HostIds.for_config(config, store)
        pool = WarmPool.for_config(engine, config, owner, host_ids) if pool_size else None
        ended: list[str] = []
        claims = await volumes(store) if volumes is not None else None
        disk_quota = DiskQuota(
            config.tenancy.max_disk_bytes,
            store,
            await VolumeStore(store.db).open(),
            snap_store,
        )

        async def on_end(session_id: str) -> None:
            ended.append(session_id)

        resumed: list[str] = []

        async def on_resume(session: Any) -> None:
            resumed.append(session.session_id)

        sessions = SessionManager(
            config,
            engine,
            store,
            owner,
            keeper,
            pool=pool,
            on_session_end=[on_end],
            tiers=tiers,
            egress=egress,
            host_ids=host_ids,
            volumes=claims,
            memory=MemoryOptions(
                checkpoints=snap_store,
                on_resume=[on_resume],
                room=lambda tenant, need: quota.check_checkpoint_room(tenant, need),
            ),
            commands=commands,
            disk_quota=disk_quota,
            **({"observer": observer} if observer is not None else {}),
        )
        quota = ImageQuota(
            config.tenancy.max_image_bytes,
            engine,
            await TemplateStore(store.db).open(),
            snap_store.images_of,
            checkpoint_bytes=snap_store.memory_bytes,
        )
        snapshots = Snapshots(
            keeper,
            snap_store,
            sessions,
            engine,
            store,
            quota=quota,
            max_image_bytes=config.images.max_image_bytes,
            disk_quota=disk_quota,
            **({"observer": observer} if observer is not None else {}),
        )
        stack = Stack(
            engine,
            commands,
            store,
            snap_store,
            workspace,
            sessions,
            snapshots,
            pool,
            owner,
            ended,
            resumed,
        )
        stack.volumes = claims
        stack.disk_quota = disk_quota
        try:
            yield stack
        finally:
            if pool is not None:
                await pool.close()


async def as_tenant(tenant: str, call: Callable[[], Awaitable[T]]) -> T:
    """Run `call` in its own task serving `tenant`, as an authenticated RPC would."""

    async def run() -> T:
        tenancy.use_tenant(tenant)
        return await call()

    return await asyncio.create_task(run())
