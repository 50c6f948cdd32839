"""The helper's volume on a real engine: filled from the server's file through the archive API."""

from __future__ import annotations

import shutil
from pathlib import Path

import aiodocker
from sandboxd.engine.helper_volume import HelperVolume

REPO = Path(__file__).resolve().parents[2]
IMAGE = "sandboxd-runtime:busybox"


async def test_a_new_helper_fills_its_volume_without_blocking_the_loop(tmp_path: Path) -> None:
    """The helper is over 1 MiB: sent as raw bytes, aiohttp writes it in one blocking call and
    warns (ResourceWarning, an error in this suite). A helper of new content gets a new volume,
    filled with exactly its bytes."""
    helper = tmp_path / "sbx"
    shutil.copyfile(REPO / "build" / "sbx", helper)
    with helper.open("ab") as fh:
        fh.write(b"\0" + tmp_path.name.encode())  # new content, new volume name
    assert helper.stat().st_size > 1024 * 1024
    volume = HelperVolume(helper)
    docker = aiodocker.Docker()
    try:
        await volume.ensure(docker, IMAGE)
        reader = await docker.containers.create(
            {
                "Image": IMAGE,
                "Entrypoint": [],
                "Cmd": ["true"],
                "NetworkDisabled": True,
                "HostConfig": {"Binds": [f"{volume.name}:/h:ro"], "NetworkMode": "none"},
            }
        )
        try:
            tar = await reader.get_archive("/h/sbx")
            with tar:
                member = tar.next()
                assert member is not None
                got = tar.extractfile(member)
                assert got is not None and got.read() == helper.read_bytes()
        finally:
            await reader.delete(force=True)
    finally:
        try:
            await (await docker.volumes.get(volume.name)).delete()  # type: ignore[no-untyped-call]
        finally:
            await docker.close()
