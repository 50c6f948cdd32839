"""Disk workspaces in the session domain, over the engine fake: what a create asks for (sizes,
defaults, maxima), a disk outliving its sandbox (suspend without a tar, a lost sandbox rebuilt
on it with every file), the disk going with its session (delete, expiry, a failed create),
and the sweep removing the disks no session holds, and nothing else."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from fakes import FakeEngine
from sandboxd.config_sections.units import GiB, MiB
from sandboxd.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from sandboxd.models import (
    RESTORED_FROM_DISK,
    LimitsRequest,
    ManifestFile,
    SessionState,
    WorkspaceManifest,
    WorkspaceStorage,
)
from sandboxd.processes.budget import session_agent_budget
from sandboxd.sessions import CreateSessionInput
from session_stack import session_stack

DISK = WorkspaceStorage.DISK
MANIFEST = WorkspaceManifest(files=(ManifestFile("keep.txt", b"kept", 0o644),))


def _disk(session_id: str = "d1", size: int = 0, **more: object) -> CreateSessionInput:
    return CreateSessionInput(
        session_id=session_id, storage=DISK, size_bytes=size, manifest=MANIFEST, **more
    )  # type: ignore[arg-type]


async def test_a_disk_workspace_gets_its_size_and_is_not_counted_against_memory(
    tmp_path: Path,
) -> None:
    async with session_stack(tmp_path) as st:
        made = await st.sessions.create(_disk(size=4 * GiB))
        spec = made.spec
        assert spec.on_disk and spec.disk_id.startswith("ws-")
        assert spec.limits.workspace_bytes == 4 * GiB  # every cap that reads it follows
        assert spec.memory_workspace_bytes == 0
        disk = st.engine.disks.disks[spec.disk_id]
        assert (disk.size_bytes, disk.uid, disk.gid) == (4 * GiB, spec.uid, spec.gid)
        # The agent's budget of a 256 MiB sandbox is not eaten by a 4 GiB disk.
        assert session_agent_budget(spec) == 128 * MiB
        default = await st.sessions.create(_disk("d2"))
        assert default.spec.limits.workspace_bytes == 10 * GiB  # default_disk_bytes
        memory = await st.sessions.create(CreateSessionInput(session_id="m1"))
        assert memory.spec.storage is WorkspaceStorage.MEMORY and not memory.spec.disk_id
        assert memory.fingerprint != default.fingerprint


async def test_the_operator_default_storage_is_used_when_none_is_asked(tmp_path: Path) -> None:
    async with session_stack(tmp_path, default_workspace_storage="disk") as st:
        made = await st.sessions.create(CreateSessionInput(session_id="d1"))
        assert made.spec.on_disk and made.spec.limits.workspace_bytes == 10 * GiB


@pytest.mark.parametrize(
    ("storage", "size", "limits", "reason"),
    [
        (DISK, -1, LimitsRequest(), "LIMIT_INVALID"),
        (DISK, 101 * GiB, LimitsRequest(), "LIMIT_EXCEEDS_MAXIMUM"),
        (DISK, 4096, LimitsRequest(), "LIMIT_INVALID"),  # below the smallest disk
        (DISK, GiB, LimitsRequest(workspace_bytes=64 * MiB), "LIMIT_INVALID"),
        (WorkspaceStorage.MEMORY, GiB, LimitsRequest(), "LIMIT_INVALID"),
    ],
)
async def test_bad_disk_sizes_are_refused_and_nothing_is_made(
    tmp_path: Path,
    storage: WorkspaceStorage,
    size: int,
    limits: LimitsRequest,
    reason: str,
) -> None:
    async with session_stack(tmp_path) as st:
        asked = CreateSessionInput(session_id="d1", storage=storage, size_bytes=size, limits=limits)
        with pytest.raises(InvalidArgument) as caught:
            await st.sessions.create(asked)
        assert caught.value.reason == reason
        assert "size_bytes" in caught.value.message or "workspace_bytes" in caught.value.message
        assert not st.engine.disks.disks and not st.engine.sandboxes
        assert await st.store.get("d1") is None


async def test_an_equal_workspace_bytes_and_a_disk_over_the_tmpfs_maximum_are_fine(
    tmp_path: Path,
) -> None:
    async with session_stack(tmp_path) as st:
        made = await st.sessions.create(
            _disk(size=2 * GiB, limits=LimitsRequest(workspace_bytes=2 * GiB))
        )
        assert made.spec.limits.workspace_bytes == 2 * GiB  # past max_workspace_bytes (1 GiB)


async def test_an_engine_host_without_room_refuses_the_create_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    async with session_stack(tmp_path) as st:
        st.engine.disks.free_bytes = 1 * GiB
        with pytest.raises(ResourceExhausted) as caught:
            await st.sessions.create(_disk(size=2 * GiB))
        assert caught.value.reason == "ENGINE_DISK_FULL"
        st.engine.disks.tool = False
        with pytest.raises(FailedPrecondition) as unavailable:
            await st.sessions.create(_disk("d2", size=512 * MiB))
        assert unavailable.value.reason == "DISK_STORAGE_UNAVAILABLE"
        assert not st.engine.disks.disks and not st.engine.sandboxes
        assert await st.store.get("d1") is None and await st.store.get("d2") is None


async def test_a_create_that_fails_after_the_disk_takes_the_disk_back(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        st.engine.fail("start_sandbox")
        with pytest.raises(Exception, match="injected"):
            await st.sessions.create(_disk())
        assert not st.engine.disks.disks and not st.engine.sandboxes


async def test_suspend_keeps_the_disk_without_a_snapshot_and_resume_mounts_it(
    tmp_path: Path,
) -> None:
    async with session_stack(tmp_path) as st:
        made = await st.sessions.create(_disk())
        st.engine.sandboxes[made.container_id].files["later.txt"] = b"after create"
        suspended = await st.sessions.suspend("d1")
        assert suspended.state is SessionState.SUSPENDED and not st.engine.sandboxes
        assert await st.snap_store.of_session("d1") == []  # no tar round trip
        back = await st.sessions.resume("d1", None)
        box = st.engine.sandboxes[back.container_id]
        assert box.files == {"keep.txt": b"kept", "later.txt": b"after create"}
        assert back.loss is None  # the caller's own suspend is no loss


async def test_a_lost_sandbox_is_rebuilt_on_its_disk_with_every_file(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        made = await st.sessions.create(_disk())
        st.engine.sandboxes[made.container_id].files["work.txt"] = b"unsaved work"
        st.engine.lose(made.container_id)
        await st.sessions.reconcile()
        lost = await st.sessions.get("d1")
        assert lost.state is SessionState.SUSPENDED and lost.loss is not None
        assert lost.loss.snapshot_id == RESTORED_FROM_DISK and lost.loss.restored_at is None
        back = await st.sessions.resume("d1", None)
        assert back.state is SessionState.RUNNING and back.loss is not None
        assert back.loss.restored_at is not None and "every file" in back.loss.message()
        assert st.engine.sandboxes[back.container_id].files["work.txt"] == b"unsaved work"


async def test_a_disk_the_engine_lost_is_rebuilt_from_the_latest_snapshot(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        made = await st.sessions.create(_disk())
        # A TAR snapshot: the server keeps it (a disk snapshot went with the host's volumes).
        await st.snapshots.create("d1", {}, "TAR")
        st.engine.lose(made.container_id)
        st.engine.disks.disks.clear()  # the engine host's volumes went too
        back = await st.sessions.resume("d1", None)
        assert st.engine.sandboxes[back.container_id].files == {"keep.txt": b"kept"}
        assert back.spec.disk_id in st.engine.disks.disks  # a fresh disk, filled from it


async def test_delete_and_expiry_remove_the_disk(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        deleted = await st.sessions.create(_disk("d1"))
        expired = await st.sessions.create(_disk("d2"))
        assert await st.sessions.delete("d1")
        assert deleted.spec.disk_id not in st.engine.disks.disks
        await st.backdate_lease("d2", timedelta(seconds=1))
        await st.sessions.reap_once()
        assert expired.spec.disk_id not in st.engine.disks.disks
        assert (await st.sessions.get("d2")).state is SessionState.EXPIRED


async def test_the_sweep_removes_only_the_disks_no_session_holds(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        live = await st.sessions.create(_disk("d1"))
        suspended = await st.sessions.create(_disk("d2"))
        await st.sessions.suspend("d2")
        disks = st.engine.disks
        await disks.create("ws-0123456789abcdef01234567", 64 * MiB, 1000, 1000)  # no record
        await disks.create("vol-tenant-a-data", 64 * MiB, 1000, 1000)  # a named volume's
        await st.sessions.reconcile()
        assert sorted(disks.disks) == sorted(
            [live.spec.disk_id, suspended.spec.disk_id, "vol-tenant-a-data"]
        )


async def test_a_fork_of_a_disk_workspace_gets_its_own_disk_with_the_files(
    tmp_path: Path,
) -> None:
    async with session_stack(tmp_path) as st:
        made = await st.sessions.create(_disk("d1"))
        st.engine.sandboxes[made.container_id].files["work.txt"] = b"to fork"
        snap = await st.snapshots.create("d1", {}, "")
        fork = await st.sessions.create(_disk("d2", from_snapshot_id=snap.snapshot_id))
        assert fork.spec.disk_id != made.spec.disk_id
        assert st.engine.sandboxes[fork.container_id].files["work.txt"] == b"to fork"
        st.engine.sandboxes[fork.container_id].files["work.txt"] = b"changed in the fork"
        assert st.engine.sandboxes[made.container_id].files["work.txt"] == b"to fork"


async def test_the_warm_pool_never_hands_a_memory_member_to_a_disk_session(
    tmp_path: Path,
) -> None:
    engine = FakeEngine()
    async with session_stack(tmp_path, pool_size=1, engine=engine) as st:
        assert st.pool is not None
        st.pool.start()
        for _ in range(200):
            if st.pool.available >= 1:
                break
            await asyncio.sleep(0.01)
        members = set(engine.sandboxes)
        assert members
        made = await st.sessions.create(_disk())
        assert made.container_id not in members and made.spec.on_disk
