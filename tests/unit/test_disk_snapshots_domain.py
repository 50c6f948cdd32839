"""Disk snapshots over the engine fake: a snapshot of a disk workspace is a copy of its disk on
the engine host (its sandbox paused for it, no tar through the server), a fork is a second copy
given to the fork's own host uid, a copy refused for room leaves nothing half-made, and the
record, delete, sweep, rebuild and download know the kind."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeEngine
from sandboxd.config_sections.units import MiB
from sandboxd.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from sandboxd.models import WorkspaceManifest, WorkspaceStorage
from sandboxd.sessions import CreateSessionInput
from sandboxd.snapshot_store import KIND_DISK
from session_stack import session_stack

DISK = WorkspaceStorage.DISK


def _disk(session_id: str, size: int = 256 * MiB, **more: object) -> CreateSessionInput:
    return CreateSessionInput(
        session_id=session_id, storage=DISK, size_bytes=size, manifest=WorkspaceManifest(), **more
    )  # type: ignore[arg-type]


class _NoTar:
    """An archive that fails the test if a disk workspace's bytes go through the server."""

    def __init__(self, engine: FakeEngine) -> None:
        from fakes import FakeArchive

        self._real = FakeArchive(engine)
        self.tars = 0

    def export(self, session: object, path: str) -> object:
        self.tars += 1
        return self._real.export(session, path)  # type: ignore[arg-type]

    async def import_(self, *args: object, **kw: object) -> object:
        self.tars += 1
        return await self._real.import_(*args, **kw)  # type: ignore[arg-type]

    async def tidy(self, session: object) -> None:
        await self._real.tidy(session)  # type: ignore[arg-type]

    async def check_restorable(self, session: object, chunks: object) -> None:
        await self._real.check_restorable(session, chunks)  # type: ignore[arg-type]


async def test_a_snapshot_and_a_fork_of_a_disk_workspace_are_copies_on_the_engine_host(
    tmp_path: Path,
) -> None:
    archives: list[_NoTar] = []

    def archive(engine: FakeEngine) -> _NoTar:
        archives.append(_NoTar(engine))
        return archives[0]

    async with session_stack(tmp_path, archive=archive) as st:
        made = await st.sessions.create(_disk("d1"))
        st.engine.sandboxes[made.container_id].files["work.txt"] = b"to fork"
        snap = await st.snapshots.create("d1", {}, "")
        assert snap.kind == KIND_DISK and snap.disk == snap.snapshot_id and not snap.sha256
        assert snap.disk_bytes == 256 * MiB and snap.size_bytes > 0
        assert st.engine.disks.frozen == [made.container_id]  # paused for the copy
        fork = await st.sessions.create(
            CreateSessionInput(session_id="d2", from_snapshot_id=snap.snapshot_id)
        )
        assert fork.spec.on_disk and fork.spec.limits.workspace_bytes == 256 * MiB
        disk = st.engine.disks.disks[fork.spec.disk_id]
        assert (
            (disk.uid, disk.gid)
            == (fork.spec.uid, fork.spec.gid)
            != (
                made.spec.uid,
                made.spec.gid,
            )
        )  # the fork's own host uid, not its source's
        assert st.engine.sandboxes[fork.container_id].files["work.txt"] == b"to fork"
        st.engine.sandboxes[fork.container_id].files["work.txt"] = b"changed"
        assert st.engine.sandboxes[made.container_id].files["work.txt"] == b"to fork"
        assert archives[0].tars == 0  # not one byte through the server
        tar = await st.snapshots.create("d1", {}, "TAR")  # asked for: a tar as before
        assert tar.kind == "TAR" and archives[0].tars == 1


async def test_a_copy_refused_for_room_leaves_nothing_half_made(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        made = await st.sessions.create(_disk("d1"))
        st.engine.sandboxes[made.container_id].files["big"] = b"x" * 4096
        disks_before = set(st.engine.disks.disks)
        st.engine.disks.free_bytes = 1024
        with pytest.raises(ResourceExhausted) as refused:
            await st.snapshots.create("d1", {}, "")
        assert refused.value.reason == "ENGINE_DISK_FULL"
        assert set(st.engine.disks.disks) == disks_before
        assert await st.snap_store.of_session("d1") == []
        st.engine.disks.free_bytes = 1 << 40
        snap = await st.snapshots.create("d1", {}, "")
        st.engine.disks.free_bytes = 1024
        with pytest.raises(ResourceExhausted) as fork_refused:
            await st.sessions.create(_disk("d2", from_snapshot_id=snap.snapshot_id))
        assert fork_refused.value.reason == "ENGINE_DISK_FULL"
        assert await st.store.get("d2") is None
        assert set(st.engine.disks.disks) == disks_before | {snap.disk}
        assert len(st.engine.sandboxes) == 1


async def test_a_disk_snapshot_is_refused_where_only_a_tar_serves(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        await st.sessions.create(_disk("d1"))
        snap = await st.snapshots.create("d1", {}, "")
        with pytest.raises(FailedPrecondition) as download:
            async for _ in st.snapshots.download(snap.snapshot_id):
                pass
        assert download.value.reason == "SNAPSHOT_NOT_TAR"
        memory = CreateSessionInput(
            session_id="m1", storage=WorkspaceStorage.MEMORY, from_snapshot_id=snap.snapshot_id
        )
        other_size = _disk("d3", 512 * MiB, from_snapshot_id=snap.snapshot_id)
        for asked in (memory, other_size):
            with pytest.raises(InvalidArgument) as refused:
                await st.sessions.create(asked)
            assert refused.value.reason == "LIMIT_INVALID"
            assert await st.store.get(asked.session_id) is None
        await st.sessions.create(CreateSessionInput(session_id="m2"))
        with pytest.raises(InvalidArgument) as kind:
            await st.snapshots.create("m2", {}, KIND_DISK)
        assert kind.value.reason == "SNAPSHOT_KIND_UNSUPPORTED"


async def test_delete_and_the_sweep_remove_snapshot_disks_and_nothing_else(
    tmp_path: Path,
) -> None:
    async with session_stack(tmp_path) as st:
        made = await st.sessions.create(_disk("d1"))
        kept = await st.snapshots.create("d1", {}, "")
        gone = await st.snapshots.create("d1", {}, "")
        await st.snapshots.delete(gone.snapshot_id)
        assert gone.disk not in st.engine.disks.disks
        orphan = "snap-0123456789abcdef"  # a copy whose server died before its record
        await st.engine.disks.create(orphan, 64 * MiB, 1000, 1000)
        assert await st.snapshots.sweep_disks() == 1
        assert sorted(st.engine.disks.disks) == sorted([made.spec.disk_id, kept.disk])
        await st.sessions.delete("d1")  # the session's snapshots go with it
        assert list(st.engine.disks.disks) == []


async def test_a_disk_the_engine_lost_is_copied_from_a_disk_snapshot_still_there(
    tmp_path: Path,
) -> None:
    async with session_stack(tmp_path) as st:
        made = await st.sessions.create(_disk("d1"))
        st.engine.sandboxes[made.container_id].files["work.txt"] = b"saved"
        snap = await st.snapshots.create("d1", {}, "")
        st.engine.lose(made.container_id)
        del st.engine.disks.disks[made.spec.disk_id]  # the workspace's disk only
        back = await st.sessions.resume("d1", None)
        assert st.engine.sandboxes[back.container_id].files == {"work.txt": b"saved"}
        assert back.loss is not None and back.loss.snapshot_id == snap.snapshot_id
        disk = st.engine.disks.disks[back.spec.disk_id]
        assert (disk.uid, disk.gid) == (back.spec.uid, back.spec.gid)


async def test_shutdown_takes_no_copy_of_a_disk_workspace(tmp_path: Path) -> None:
    import asyncio

    async with session_stack(tmp_path) as st:
        await st.sessions.create(_disk("d1"))
        await st.sessions.create(CreateSessionInput(session_id="m1"))
        assert await st.snapshots.snapshot_running(10.0, asyncio.Event()) == 1
        assert await st.snap_store.of_session("d1") == []


async def test_another_tenants_disk_snapshot_is_not_found_and_nothing_is_made(
    tmp_path: Path,
) -> None:
    from sandboxd.errors import NotFound
    from session_stack import as_tenant

    async with session_stack(tmp_path) as st:
        await st.sessions.create(_disk("d1"))
        snap = await st.snapshots.create("d1", {}, "")
        disks = set(st.engine.disks.disks)
        with pytest.raises(NotFound) as caught:
            await as_tenant(
                "other",
                lambda: st.sessions.create(
                    CreateSessionInput(session_id="other.f1", from_snapshot_id=snap.snapshot_id)
                ),
            )
        assert caught.value.reason == "SNAPSHOT_NOT_FOUND"
        assert set(st.engine.disks.disks) == disks and await st.store.get("other.f1") is None
