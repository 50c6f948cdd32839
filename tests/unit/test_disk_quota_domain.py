"""The tenant's disk quota (tenant_max_disk_bytes) over the engine fake: disk workspaces, forks,
volumes and snapshots count together, each create past it is refused with TENANT_DISK_QUOTA and
the remaining room in its details, nothing is made by a refused one, other tenants are not
counted, and a restarted server counts what exists."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from sandboxd.config_sections import VolumesSection
from sandboxd.config_sections.units import GiB, MiB
from sandboxd.errors import ResourceExhausted
from sandboxd.models import WorkspaceManifest, WorkspaceStorage
from sandboxd.sessions import CreateSessionInput
from sandboxd.snapshot_store import SnapshotStore
from sandboxd.storage.tenant_quota import DiskQuota
from sandboxd.store import SessionStore
from sandboxd.volumes.claims import VolumeClaims
from sandboxd.volumes.service import Volumes
from sandboxd.volumes.store import VolumeStore
from session_stack import OWNER, as_tenant, session_stack
from test_volumes_domain import FakeDisks

DISK = WorkspaceStorage.DISK


def _disk(session_id: str, size: int, **more: object) -> CreateSessionInput:
    return CreateSessionInput(
        session_id=session_id, storage=DISK, size_bytes=size, manifest=WorkspaceManifest(), **more
    )  # type: ignore[arg-type]


def _refusal(caught: pytest.ExceptionInfo[ResourceExhausted], remaining: int) -> None:
    assert caught.value.reason == "TENANT_DISK_QUOTA"
    assert caught.value.metadata["remaining_bytes"] == str(remaining)
    assert caught.value.metadata["quota_bytes"] == str(1 * GiB)
    assert "quota" in caught.value.message


async def test_workspaces_forks_volumes_and_snapshots_share_one_quota(tmp_path: Path) -> None:
    async with session_stack(tmp_path, tenant_max_disk_bytes=1 * GiB) as st:
        assert st.disk_quota is not None
        vstore = await VolumeStore(st.store.db).open()
        disks = FakeDisks()
        claims = VolumeClaims(vstore, st.store, disks)
        volumes = Volumes(
            dataclasses.replace(VolumesSection()), vstore, claims, disks, OWNER,
            disk_quota=st.disk_quota,
        )  # fmt: skip
        await st.sessions.create(_disk("d1", 512 * MiB))
        await volumes.create("data", 256 * MiB, {})
        with pytest.raises(ResourceExhausted) as workspace:
            await st.sessions.create(_disk("d2", 512 * MiB))
        _refusal(workspace, 256 * MiB)
        assert await st.store.get("d2") is None and len(st.engine.disks.disks) == 1
        with pytest.raises(ResourceExhausted) as volume:
            await volumes.create("more", 512 * MiB, {})
        _refusal(volume, 256 * MiB)
        assert len(disks.sizes) == 1  # the refused volume made no disk
        # A memory workspace takes no disk: not counted, not refused.
        await st.sessions.create(CreateSessionInput(session_id="m1"))
        snap = await st.snapshots.create("d1", {}, "")  # a copy of ~4 MiB: fits
        used = await st.disk_quota.used("default")
        assert used == 512 * MiB + 256 * MiB + snap.size_bytes
        # A fork of it asks for its 512 MiB again: past the quota, nothing made.
        with pytest.raises(ResourceExhausted) as fork:
            await st.sessions.create(
                CreateSessionInput(session_id="f1", from_snapshot_id=snap.snapshot_id)
            )
        _refusal(fork, 1 * GiB - used)
        assert await st.store.get("f1") is None
        # Another tenant has its own room.
        other = await as_tenant("other", lambda: st.sessions.create(_disk("other.d9", 1 * GiB)))
        assert other.spec.on_disk


async def test_a_snapshot_past_the_quota_is_taken_back(tmp_path: Path) -> None:
    async with session_stack(tmp_path, tenant_max_disk_bytes=1 * GiB) as st:
        made = await st.sessions.create(_disk("d1", 1 * GiB - 2 * MiB))
        st.engine.sandboxes[made.container_id].files["big"] = b"x" * MiB
        with pytest.raises(ResourceExhausted) as caught:
            await st.snapshots.create("d1", {}, "")  # ~5 MiB where 2 MiB remain
        _refusal(caught, 2 * MiB)
        assert await st.snap_store.of_session("d1") == []
        assert list(st.engine.disks.disks) == [made.spec.disk_id]  # its copy went too


async def test_a_restarted_server_counts_what_exists(tmp_path: Path) -> None:
    async with session_stack(tmp_path, tenant_max_disk_bytes=1 * GiB) as st:
        await st.sessions.create(_disk("d1", 768 * MiB))
        await st.snapshots.create("d1", {}, "TAR")
        tar_bytes = (await st.snap_store.of_session("d1"))[0].size_bytes
    # A new server over the same records: nothing kept in memory, everything counted.
    async with SessionStore(tmp_path / "sessions.db") as store:
        snaps = await SnapshotStore(store.db, tmp_path / "snapshots").open()
        quota = DiskQuota(1 * GiB, store, await VolumeStore(store.db).open(), snaps)
        assert await quota.used("default") == 768 * MiB + tar_bytes
        with pytest.raises(ResourceExhausted) as caught:
            await quota.check("default", 512 * MiB, "a disk workspace")
        _refusal(caught, 256 * MiB - tar_bytes)
        assert caught.value.metadata["used_bytes"] == str(768 * MiB + tar_bytes)
