"""Loop devices of disks on the engine host: a disk's image volume removed while its loop
still holds it (past `Disks.delete`: a cleanup's `docker volume rm`) leaves the loop on a
deleted file, which the sweep's reap detaches; `Disks.delete` itself detaches before the image
goes, and a test server's leftovers are removed the same way (conftest.remove_owned_disks)."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess

import aiodocker
import pytest
from conftest import remove_owned_disks
from sandboxd.config_sections.units import MiB
from sandboxd.engine.docker_errors import translate_errors
from sandboxd.storage.docker_disks import DockerDisks

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="losetup -l needs root")


def _loops() -> dict[str, str]:
    out = subprocess.run(
        ["losetup", "--list", "-n", "-O", "NAME,BACK-FILE"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line.split()[0]: line.split(None, 1)[1].strip() for line in out.splitlines()}


def _disks(docker: aiodocker.Docker, owner: str) -> DockerDisks:
    return DockerDisks(
        lambda: docker, translate_errors, owner_id=owner, tool_image="sandboxd-disktool:1"
    )


def _device(mount_volume: str) -> str:
    return "/dev/" + mount_volume.rsplit("-", 2)[1]  # sandboxd-diskmnt-<id>-loopN-x


def test_a_removed_attached_image_leaves_a_loop_the_reap_detaches() -> None:
    owner = "loops" + secrets.token_hex(4)
    disk_id = "ws-" + secrets.token_hex(12)

    async def run() -> None:
        async with aiodocker.Docker() as docker:
            disks = _disks(docker, owner)
            await disks.create(disk_id, 64 * MiB, 1000, 1000)
            device = _device(await disks.attach(disk_id))
            assert _loops()[device] == "/disk.img"
            # What a cleanup by engine volumes did: the mount volume, then the image.
            for name in (await disks.attach(disk_id), disks.image_volume(disk_id)):
                await aiodocker.volumes.DockerVolume(docker, name).delete()  # type: ignore[no-untyped-call]
            assert _loops()[device] == "/disk.img (deleted)"  # the defect's trace
            reaped = await disks.reap()
            assert device in reaped
            assert device not in _loops()
            assert not any(v.endswith("(deleted)") for v in _loops().values())

    try:
        asyncio.run(run())
    finally:
        remove_owned_disks(owner)


def test_delete_and_the_test_cleanup_detach_before_the_image_goes() -> None:
    owner = "loops" + secrets.token_hex(4)
    kept, deleted = ("ws-" + secrets.token_hex(12) for _ in range(2))

    async def run() -> tuple[str, str]:
        async with aiodocker.Docker() as docker:
            disks = _disks(docker, owner)
            devices = []
            for disk_id in (kept, deleted):
                await disks.create(disk_id, 64 * MiB, 1000, 1000)
                devices.append(_device(await disks.attach(disk_id)))
            assert await disks.delete(deleted)
            assert devices[1] not in _loops()
            return devices[0], devices[1]

    try:
        left, _ = asyncio.run(run())
        assert _loops()[left] == "/disk.img"
    finally:
        remove_owned_disks(owner)  # what a stopped test server's leftovers get
    assert left not in _loops() or not _loops()[left].endswith("(deleted)")
    found = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"label=io.sandboxd.owner={owner}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert found == []
