"""Named volumes on the engine fake: the checks of a request's text, records, tenant scoping,
paging and labels, quotas, one writer or many readers, DeleteVolume of a mounted volume, what a
failed create leaves, the sweep, and volumes outliving a server restart. No Docker; seconds."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sandboxd import tenancy
from sandboxd.config_sections import VolumesSection
from sandboxd.errors import (
    AlreadyExists,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from sandboxd.models import SessionState, VolumeMount
from sandboxd.reasons import Reason
from sandboxd.sessions import CreateSessionInput
from sandboxd.store import SessionStore
from sandboxd.volumes import checks
from sandboxd.volumes.claims import VolumeClaims
from sandboxd.volumes.port import DISK_PREFIX
from sandboxd.volumes.service import Volumes
from sandboxd.volumes.store import VolumeStore
from session_stack import OWNER, Stack, as_tenant, session_stack

GiB = 1024**3


class FakeDisks:
    """The VolumeDisks port in memory: sizes, owners, and failures on demand."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.owners: dict[str, tuple[int, int]] = {}
        self.fail_create = False
        self.removed: list[str] = []

    async def create_disk(self, name: str, size_bytes: int) -> None:
        if self.fail_create:
            raise ResourceExhausted("no room on the engine host", reason=Reason.RESOURCE_EXHAUSTED)
        self.sizes[name] = size_bytes

    async def remove_disk(self, name: str) -> None:
        self.sizes.pop(name, None)
        self.removed.append(name)

    async def disk_used_bytes(self, name: str) -> int:
        return 4096 if name in self.sizes else 0

    async def list_disks(self, prefix: str) -> list[str]:
        return sorted(n for n in self.sizes if n.startswith(prefix))

    async def own_disk(self, name: str, uid: int, gid: int) -> None:
        assert name in self.sizes, f"handing over a disk that is not there: {name}"
        self.owners[name] = (uid, gid)


@dataclasses.dataclass
class World:
    stack: Stack
    volumes: Volumes
    disks: FakeDisks
    store: VolumeStore


def _settings(**kw: Any) -> VolumesSection:
    return dataclasses.replace(VolumesSection(), **kw)


async def _world_parts(
    store: SessionStore, disks: FakeDisks, settings: VolumesSection
) -> tuple[VolumeStore, VolumeClaims, Volumes]:
    vstore = await VolumeStore(store.db).open()
    claims = VolumeClaims(vstore, store, disks)
    return vstore, claims, Volumes(settings, vstore, claims, disks, OWNER)


class _Built:
    def __init__(self, settings: VolumesSection) -> None:
        self.settings = settings
        self.disks = FakeDisks()
        self.parts: tuple[VolumeStore, VolumeClaims, Volumes] | None = None

    async def __call__(self, store: SessionStore) -> VolumeClaims:
        self.parts = await _world_parts(store, self.disks, self.settings)
        return self.parts[1]


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    built = _Built(_settings(tenant_max_volumes=5, tenant_max_bytes=10 * GiB))
    async with session_stack(tmp_path, volumes=built) as st:
        assert built.parts is not None
        yield World(st, built.parts[2], built.disks, built.parts[0])


def _mount(volume_id: str, path: str = "/mnt/data", read_only: bool = False) -> VolumeMount:
    return VolumeMount(volume_id=volume_id, path=path, read_only=read_only)


def _session(session_id: str, *mounts: VolumeMount) -> CreateSessionInput:
    return CreateSessionInput(session_id=session_id, volumes=mounts)


# ----- the text of a request --------------------------------------------------------------


@pytest.mark.parametrize(
    "volume_id",
    ["a/b", "../x", "x" * 300, "Data", "dаta", "data\n", "", " data", "data\x00", "-x", "a" * 64],
)
def test_volume_ids_outside_the_alphabet_are_refused(volume_id: str) -> None:
    # "dаta" holds a Cyrillic a; uppercase and a trailing newline fail as any other character.
    with pytest.raises(InvalidArgument) as err:
        checks.validate_volume_id(volume_id)
    assert err.value.reason == Reason.INVALID_VOLUME_ID


@pytest.mark.parametrize("size", [-1, -(2**62), 1, 16 * 1024**2 - 1, 20 * GiB + 1])
def test_sizes_negative_or_past_the_maximum_are_refused(size: int) -> None:
    with pytest.raises(InvalidArgument) as err:
        checks.check_size(size, GiB, 20 * GiB)
    assert err.value.reason == Reason.VOLUME_SIZE_INVALID


def test_size_zero_is_the_default_and_the_maximum_is_allowed() -> None:
    assert checks.check_size(0, GiB, 20 * GiB) == GiB
    assert checks.check_size(20 * GiB, GiB, 20 * GiB) == 20 * GiB


@pytest.mark.parametrize(
    "path",
    [
        "",
        "mnt/data",
        "/mnt",
        "/mnt/",
        "/workspace",
        "/workspace/",
        "/workspace/data/deeper",  # one folder directly below /workspace only
        "/workspace/.sbx-import-0123",  # the import's staging names
        "/workspaces/data",
        "/",
        "/etc",
        "/tmp/x",
        "/.sandboxd/x",
        "/mnt//data",
        "/mnt/data/",
        "/mnt/./data",
        "/mnt/data/..",
        "/mnt/../etc",
        "/mnt/a\x00b",
        "/mnt/dat\u0430",  # a Cyrillic a
        "/mnt/a\u2215b",  # DIVISION SLASH looks like one
        "/mnt/a\nb",
        "/mnt/" + "x" * 65,
        "/mnt/" + "/".join("d" * 9),
        "//mnt/data",
    ],
)
def test_mount_paths_outside_mnt_or_not_normal_are_refused(path: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        checks.check_mount_path(path)
    assert err.value.reason == Reason.MOUNT_PATH_INVALID


def test_a_folder_directly_below_the_workspace_is_a_mount_path() -> None:
    assert checks.check_mount_path("/workspace/data") == "/workspace/data"
    mounts = (_mount("a", "/workspace/data"), _mount("b", "/mnt/data"))
    assert checks.workspace_mounts(checks.check_mounts(mounts, 8)) == {"data"}


@pytest.mark.parametrize(
    "paths",
    [("/mnt/a", "/mnt/a"), ("/mnt/a", "/mnt/a/b"), ("/mnt/a/b", "/mnt/a")],
)
def test_mounts_over_each_other_are_refused(paths: tuple[str, str]) -> None:
    mounts = [_mount("v1", paths[0]), _mount("v2", paths[1])]
    with pytest.raises(InvalidArgument) as err:
        checks.check_mounts(mounts, 8)
    assert err.value.reason == Reason.MOUNT_PATH_INVALID


def test_one_volume_twice_or_too_many_mounts_are_refused() -> None:
    with pytest.raises(InvalidArgument):
        checks.check_mounts([_mount("v1", "/mnt/a"), _mount("v1", "/mnt/b")], 8)
    with pytest.raises(InvalidArgument):
        checks.check_mounts([_mount(f"v{i}", f"/mnt/{i}") for i in range(3)], 2)
    ok = checks.check_mounts([_mount("v1", "/mnt/a"), _mount("v2", "/mnt/ab")], 8)
    assert [m.path for m in ok] == ["/mnt/a", "/mnt/ab"]


# ----- records, tenants, paging --------------------------------------------------------------


async def test_create_is_idempotent_and_a_different_one_is_refused(world: World) -> None:
    v = await world.volumes.create("data", GiB, {"team": "a"})
    again = await world.volumes.create("data", GiB, {"team": "a"})
    assert again.record.disk == v.record.disk and len(world.disks.sizes) == 1
    with pytest.raises(AlreadyExists) as err:
        await world.volumes.create("data", 2 * GiB, {"team": "a"})
    assert err.value.reason == Reason.VOLUME_ALREADY_EXISTS
    generated = await world.volumes.create("", 0, {})
    assert checks.is_volume_id(generated.record.volume_id)
    assert generated.record.size_bytes == VolumesSection().default_bytes
    # The disk's name is the server's: it says nothing of the id or the tenant.
    assert v.record.disk.startswith(DISK_PREFIX) and "data" not in v.record.disk
    got = await world.volumes.get("data")
    assert (got.record.labels, got.used_bytes, got.attached) == ({"team": "a"}, 4096, ())
    assert v.used_bytes == 0  # a new volume is not measured (a container run per disk)


async def test_another_tenants_volume_is_not_found_and_never_revealed(world: World) -> None:
    await as_tenant("alice", lambda: world.volumes.create("data", GiB, {}))
    for call in (
        lambda: world.volumes.get("data"),
        lambda: world.stack.sessions.create(_session("bob.s", _mount("data"))),
    ):
        with pytest.raises(NotFound) as err:
            await as_tenant("bob", call)
        assert err.value.reason == Reason.VOLUME_NOT_FOUND
        assert "alice" not in err.value.message
    assert await as_tenant("bob", lambda: world.volumes.delete("data")) is False
    listed, _ = await as_tenant("bob", lambda: world.volumes.list({}, 0, ""))
    assert listed == []
    # Bob's own "data" is another volume with another disk; Alice's is untouched.
    bobs = await as_tenant("bob", lambda: world.volumes.create("data", 2 * GiB, {}))
    alices = await as_tenant("alice", lambda: world.volumes.get("data"))
    assert bobs.record.disk != alices.record.disk and alices.record.size_bytes == GiB


async def test_list_pages_in_id_order_with_labels(world: World) -> None:
    for i in range(5):
        await world.volumes.create(f"v{i}", GiB, {"kind": "even" if i % 2 == 0 else "odd"})
    first, token = await world.volumes.list({}, 2, "")
    second, token2 = await world.volumes.list({}, 2, token)
    third, token3 = await world.volumes.list({}, 2, token2)
    ids = [v.record.volume_id for v in first + second + third]
    assert ids == [f"v{i}" for i in range(5)] and token3 == ""
    evens, _ = await world.volumes.list({"kind": "even"}, 0, "")
    assert [v.record.volume_id for v in evens] == ["v0", "v2", "v4"]
    with pytest.raises(InvalidArgument) as err:  # a token made for another filter
        await world.volumes.list({"kind": "odd"}, 2, token)
    assert err.value.reason == Reason.INVALID_PAGE_TOKEN
    with pytest.raises(InvalidArgument):  # and for another tenant
        await as_tenant("bob", lambda: world.volumes.list({}, 2, token))


async def test_tenant_quota_counts_volumes_and_bytes(world: World) -> None:
    await world.volumes.create("big", 9 * GiB, {})
    with pytest.raises(ResourceExhausted) as err:
        await world.volumes.create("more", 2 * GiB, {})
    assert err.value.reason == Reason.VOLUME_QUOTA_EXCEEDED
    for i in range(4):
        await world.volumes.create(f"s{i}", 1024**2 * 16, {})
    with pytest.raises(ResourceExhausted) as err:
        await world.volumes.create("sixth", 1024**2 * 16, {})
    assert err.value.reason == Reason.VOLUME_QUOTA_EXCEEDED
    assert len(world.disks.sizes) == 5  # nothing made for the refused ones
    # Another tenant has its own quota.
    await as_tenant("bob", lambda: world.volumes.create("more", 2 * GiB, {}))


# ----- mounts: one writer or many readers ------------------------------------------------------


async def test_a_second_writer_is_refused_and_the_first_ones_end_frees_it(world: World) -> None:
    await world.volumes.create("data", GiB, {})
    a = await world.stack.sessions.create(_session("a", _mount("data")))
    assert a.spec.volumes[0].disk and world.disks.owners[a.spec.volumes[0].disk] == (
        a.spec.uid,
        a.spec.gid,
    )
    box = world.stack.engine.sandboxes[a.container_id]
    assert box.request.spec.volumes == a.spec.volumes  # the sandbox is made with its mount
    for mount in (_mount("data"), _mount("data", read_only=True)):
        with pytest.raises(FailedPrecondition) as err:
            await world.stack.sessions.create(_session("b", mount))
        assert err.value.reason == Reason.VOLUME_IN_USE
        assert err.value.metadata["session_id"] == "a"
    assert await world.stack.store.get("b") is None  # nothing half-made
    got = await world.volumes.get("data")
    assert got.attached == (("a", False),)
    await world.stack.sessions.delete("a")
    b = await world.stack.sessions.create(_session("b", _mount("data", "/mnt/x/y")))
    assert world.disks.owners[b.spec.volumes[0].disk] == (b.spec.uid, b.spec.gid)


async def test_many_readers_share_a_volume_and_keep_a_writer_out(world: World) -> None:
    await world.volumes.create("data", GiB, {})
    disk = (await world.volumes.get("data")).record.disk
    await world.stack.sessions.create(_session("r1", _mount("data", read_only=True)))
    await world.stack.sessions.create(_session("r2", _mount("data", read_only=True)))
    assert disk not in world.disks.owners  # readers never hand the files over
    with pytest.raises(FailedPrecondition) as err:
        await world.stack.sessions.create(_session("w", _mount("data")))
    assert err.value.reason == Reason.VOLUME_IN_USE
    assert (await world.volumes.get("data")).attached == (("r1", True), ("r2", True))


async def test_delete_of_a_mounted_volume_is_refused(world: World) -> None:
    await world.volumes.create("data", GiB, {})
    await world.stack.sessions.create(_session("a", _mount("data", read_only=True)))
    with pytest.raises(FailedPrecondition) as err:
        await world.volumes.delete("data")
    assert err.value.reason == Reason.VOLUME_IN_USE
    assert len(world.disks.sizes) == 1
    await world.stack.sessions.delete("a")
    assert await world.volumes.delete("data") is True
    assert world.disks.sizes == {} and await world.volumes.delete("data") is False


async def test_a_suspended_session_keeps_its_claim_an_expired_one_frees_it(world: World) -> None:
    await world.volumes.create("data", GiB, {})
    await world.stack.sessions.create(_session("a", _mount("data")))
    session = await world.stack.store.get("a")
    assert session is not None
    for state, refused in ((SessionState.SUSPENDED, True), (SessionState.EXPIRED, False)):
        session.state = state
        await world.stack.store.update(session)
        if refused:
            with pytest.raises(FailedPrecondition):
                await world.stack.sessions.create(_session("b", _mount("data")))
        else:
            await world.stack.sessions.create(_session("b", _mount("data")))


async def test_volumes_enter_the_fingerprint_and_a_retried_create_is_the_same(
    world: World,
) -> None:
    await world.volumes.create("data", GiB, {})
    await world.volumes.create("other", GiB, {})
    a = await world.stack.sessions.create(_session("a", _mount("data")))
    again = await world.stack.sessions.create(_session("a", _mount("data")))
    assert again.container_id == a.container_id  # not refused as its own second writer
    with pytest.raises(AlreadyExists):
        await world.stack.sessions.create(_session("a", _mount("other")))
    plain = await world.stack.sessions.create(CreateSessionInput(session_id="p"))
    assert plain.fingerprint != a.fingerprint and plain.spec.volumes == ()


async def test_a_missing_volume_refuses_the_create_before_anything_is_made(world: World) -> None:
    with pytest.raises(NotFound) as err:
        await world.stack.sessions.create(_session("a", _mount("nope")))
    assert err.value.reason == Reason.VOLUME_NOT_FOUND
    assert await world.stack.store.get("a") is None and world.stack.engine.sandboxes == {}


# ----- what failures and the sweep leave ------------------------------------------------------


async def test_a_disk_that_cannot_be_made_leaves_no_record(world: World) -> None:
    world.disks.fail_create = True
    with pytest.raises(ResourceExhausted):
        await world.volumes.create("data", GiB, {})
    world.disks.fail_create = False
    with pytest.raises(NotFound):
        await world.volumes.get("data")


async def test_a_record_that_cannot_be_written_takes_its_disk_back(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(record: Any) -> None:
        raise Internal("the database is gone")

    monkeypatch.setattr(world.store, "insert", broken)
    with pytest.raises(Internal):
        await world.volumes.create("data", GiB, {})
    assert world.disks.sizes == {} and len(world.disks.removed) == 1


async def test_the_sweep_removes_only_disks_no_volume_owns(world: World) -> None:
    kept = await world.volumes.create("data", GiB, {})
    orphan = f"{DISK_PREFIX}deadbeef"
    others = "ws-cafe"
    for name in (orphan, others):
        world.disks.sizes[name] = GiB
    world.volumes._making.add(f"{DISK_PREFIX}making")
    world.disks.sizes[f"{DISK_PREFIX}making"] = GiB
    assert await world.volumes.sweep() == 1
    assert orphan not in world.disks.sizes
    assert {kept.record.disk, others, f"{DISK_PREFIX}making"} <= set(world.disks.sizes)


async def test_volumes_outlive_a_server_restart(tmp_path: Path) -> None:
    first = _Built(_settings())
    async with session_stack(tmp_path, volumes=first) as st:
        assert first.parts is not None
        await first.parts[2].create("data", GiB, {"keep": "yes"})
        await st.sessions.create(_session("a", _mount("data")))
    again = _Built(_settings())
    again.disks = first.disks  # the engine's disks stay where they are
    async with session_stack(tmp_path, volumes=again) as st:
        assert again.parts is not None
        got = await again.parts[2].get("data")
        assert got.record.labels == {"keep": "yes"} and got.attached == (("a", False),)
        with pytest.raises(FailedPrecondition):
            await st.sessions.create(_session("b", _mount("data")))


async def test_the_default_tenant_is_the_callers_without_authentication(world: World) -> None:
    v = await world.volumes.create("data", GiB, {})
    assert v.record.tenant == tenancy.current()
