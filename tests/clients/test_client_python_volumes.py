"""The Python client's volume calls and `sandboxctl volume` against a real server: create,
mount in a session, export and import as tar streams, list by label, delete."""

from __future__ import annotations

import io
import os
import secrets
import subprocess
import sys
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import ServerProcess
from sandboxd_client import SandboxClient, VolumeMount
from sandboxd_client.errors import SandboxError

SANDBOXCTL = Path(sys.executable).parent / "sandboxctl"


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[SandboxClient]:
    async with SandboxClient(server.address) as c:
        yield c


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _tar(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def test_volume_calls_round_trip(client: SandboxClient) -> None:
    tag = secrets.token_hex(4)
    volume_id = f"cv-{tag}"
    made = await client.create_volume(volume_id, size_bytes=32 * 1024**2, labels={"t": tag})
    assert (made.volume_id, made.size_bytes, made.attached) == (volume_id, 32 * 1024**2, ())
    try:
        imported = await client.import_volume(volume_id, _chunks(_tar("hello.txt", b"hi")))
        assert imported.volume_id == volume_id
        session = await client.create_session(
            allow_all=True, volumes=[VolumeMount(volume_id, "/mnt/v")]
        )
        try:
            ran = await session.run(["sh", "-c", "cat /mnt/v/hello.txt; echo x > /mnt/v/y"])
            assert ran.stdout == b"hi" and ran.exit_code == 0
            assert session.info.volumes[0].volume_id == volume_id  # echoed
            got = await client.get_volume(volume_id)
            assert got.attached == ((session.id, False),)
            with pytest.raises(SandboxError) as err:
                await client.delete_volume(volume_id)
            assert err.value.reason == "VOLUME_IN_USE"
        finally:
            await session.delete()
        data = b"".join([c async for c in client.export_volume(volume_id)])
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            assert sorted(m.name for m in tar.getmembers() if m.isfile()) == [
                "./hello.txt",
                "./y",
            ]
        listed = [v.volume_id async for v in client.list_volumes(labels={"t": tag})]
        assert listed == [volume_id]
    finally:
        assert await client.delete_volume(volume_id) is True


def test_sandboxctl_volume_create_ls_rm(server: ServerProcess) -> None:
    env = {**os.environ, "SANDBOXD_ADDR": server.address}

    def ctl(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [str(SANDBOXCTL), *args], capture_output=True, env=env, timeout=120, check=False
        )

    volume_id = "cli-" + secrets.token_hex(4)
    made = ctl("volume", "create", volume_id, "--size", str(16 * 1024**2), "--label", "k=v")
    assert made.returncode == 0 and made.stdout.decode().strip() == volume_id, made.stderr
    listed = ctl("volume", "ls", "--label", "k=v")
    assert listed.returncode == 0 and volume_id in listed.stdout.decode(), listed.stderr
    bad = ctl("create", "--volume", f"{volume_id}:/workspace/a/b")
    assert bad.returncode != 0 and b"MOUNT_PATH_INVALID" in bad.stderr
    assert ctl("volume", "rm", volume_id).returncode == 0
