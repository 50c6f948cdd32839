"""The engine side of volumes without Docker: the porter that exports and imports a volume
through the archive transfer (a sandbox of its own, the disk at /workspace, a host uid held
for it, nothing left behind), the container profile's volume mounts, the hand-over container's
document, and each mount resolved to the disk's engine volume right before a create."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeArchive, FakeEngine
from sandboxd.config import Config
from sandboxd.engine.docker_profile import container_config
from sandboxd.engine.docker_volumes import own_config, with_volume_sources
from sandboxd.engine.protocol import SandboxRequest
from sandboxd.errors import Internal, SandboxError
from sandboxd.host_ids import HostIds
from sandboxd.models import VolumeMount
from sandboxd.store import SessionStore
from sandboxd.volumes.porting import SandboxPorter
from test_volumes_domain import FakeDisks

DISK = "vol-0123456789abcdef"


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


@pytest.fixture
async def porter(tmp_path: Path) -> AsyncIterator[tuple[SandboxPorter, FakeEngine, FakeDisks]]:
    config = Config(data_dir=tmp_path)
    engine, disks = FakeEngine(), FakeDisks()
    disks.sizes[DISK] = 64 * 1024**2
    async with SessionStore(tmp_path / "sessions.db") as store:
        yield (
            SandboxPorter(
                engine,
                FakeArchive(engine),  # type: ignore[arg-type]
                disks,
                HostIds.for_config(config, store),
                owner_id="own1",
                image="sandboxd-runtime:busybox",
                limits=config.limits.default,
            ),
            engine,
            disks,
        )


async def test_an_export_runs_in_a_porter_of_its_own_that_goes_after(
    porter: tuple[SandboxPorter, FakeEngine, FakeDisks],
) -> None:
    p, engine, disks = porter
    seen: list[SandboxRequest] = []
    real = engine.create_sandbox

    async def watched(request: SandboxRequest) -> str:
        seen.append(request)
        return await real(request)

    engine.create_sandbox = watched  # type: ignore[method-assign]
    data = b"".join([c async for c in p.export(DISK, 64 * 1024**2)])
    assert data  # the fake's tar of an empty workspace
    (request,) = seen
    assert request.owner_id == "own1-porter"  # never a session's reconcile's
    assert request.spec.volumes == (VolumeMount("", "/workspace", True, DISK),)
    assert request.spec.limits.workspace_bytes == 64 * 1024**2
    assert disks.owners[DISK] == (request.spec.uid, request.spec.gid)  # handed to the porter
    assert engine.sandboxes == {}


async def test_a_refused_import_leaves_no_porter(
    porter: tuple[SandboxPorter, FakeEngine, FakeDisks],
) -> None:
    p, engine, _ = porter
    with pytest.raises(SandboxError):
        await p.import_(DISK, 64 * 1024**2, False, _chunks(b"not a tar" * 100))
    assert engine.sandboxes == {}


async def test_the_sweep_removes_porters_a_dead_server_left(
    porter: tuple[SandboxPorter, FakeEngine, FakeDisks],
) -> None:
    p, engine, _ = porter
    left = await engine.create_sandbox(
        SandboxRequest(spec=_spec(), owner_id="own1-porter", name="sandboxd-own1-porter-old")
    )
    assert await p.sweep() == 1 and left not in engine.sandboxes


def _spec() -> Any:
    from sandboxd.sessions.spec import CreateSessionInput, check_create

    return check_create(CreateSessionInput(session_id="x"), Config(), None).spec


def test_the_profile_mounts_each_volume_and_only_a_porter_replaces_the_workspace() -> None:
    spec = dataclasses.replace(
        _spec(),
        volumes=(
            VolumeMount("a", "/mnt/a", False, "sandboxd-diskmnt-a"),
            VolumeMount("b", "/mnt/b/c", True, "sandboxd-diskmnt-b"),
        ),
    )
    config = container_config(
        SandboxRequest(spec=spec, owner_id="o", name="n"), helper_volume="h", keeper_user="1:1"
    )
    host = config["HostConfig"]
    assert [(m["Source"], m["Target"], m["ReadOnly"]) for m in host["Mounts"]] == [
        ("sandboxd-diskmnt-a", "/mnt/a", False),
        ("sandboxd-diskmnt-b", "/mnt/b/c", True),
    ]
    assert all(
        m["Type"] == "volume" and m["VolumeOptions"] == {"NoCopy": True} for m in host["Mounts"]
    )
    assert "/workspace" in host["Tmpfs"]
    porter = dataclasses.replace(spec, volumes=(VolumeMount("", "/workspace", True, "d"),))
    config = container_config(
        SandboxRequest(spec=porter, owner_id="o", name="n"), helper_volume="h", keeper_user="1:1"
    )
    assert "/workspace" not in config["HostConfig"]["Tmpfs"]


@pytest.mark.parametrize("ids", [(0, 100), (100, 0), (True, 100), (2**31, 100), (-1, 5)])
def test_the_hand_over_takes_only_non_root_numbers(ids: tuple[Any, Any]) -> None:
    with pytest.raises(Internal):
        own_config("img", "vol", ids[0], ids[1], {})


def test_the_hand_over_container_has_three_capabilities_and_no_network() -> None:
    doc = own_config("img", "vol", 100123, 100123, {})
    host = doc["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and host["CapAdd"] == ["CHOWN", "FOWNER", "DAC_READ_SEARCH"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] and host["Runtime"] == "runc"
    assert doc["Cmd"][-2:] == ["100123", "100123"] and "-h" in doc["Cmd"][2]


async def test_each_mount_is_resolved_to_the_disks_engine_volume_before_a_create() -> None:
    class Attach:
        calls: list[str] = []

        async def attach(self, disk_id: str, flags: Any = None) -> str:
            self.calls.append(disk_id)
            return f"sandboxd-diskmnt-{disk_id}-loop7-x"

    spec = dataclasses.replace(_spec(), volumes=(VolumeMount("a", "/mnt/a", False, DISK),))
    request = SandboxRequest(spec=spec, owner_id="o", name="n")
    disks = Attach()
    resolved = await with_volume_sources(disks, request)  # type: ignore[arg-type]
    assert resolved.spec.volumes[0].disk == f"sandboxd-diskmnt-{DISK}-loop7-x"
    assert disks.calls == [DISK] and request.spec.volumes[0].disk == DISK
    plain = SandboxRequest(spec=_spec(), owner_id="o", name="n")
    assert await with_volume_sources(disks, plain) is plain  # type: ignore[arg-type]
