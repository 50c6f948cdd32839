"""A volume outlives an engine restart: its disk (an image in an engine volume, on a loop
device of the host) is mounted again by the next session after the engine stopped and started.

The shared engine is never touched: this runs test_engine_outage.py's private dockerd (its own
socket, data root and network namespace) and points a server of its own at it. Loop devices
are the host's: every one this test's disks were attached to is detached at the end, and no
other (never `losetup -D`).
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import IMAGE, make_stubs, start_server
from sandboxd.v1 import common_pb2, process_pb2, session_pb2, volumes_pb2, volumes_pb2_grpc
from test_engine_outage import (
    NOT_SERVING,
    SERVING,
    PrivateEngine,
    pytestmark,  # noqa: F401  (root, dockerd, unshare and ip: the same needs)
    wait_for_health,
)

DISK_TOOL_IMAGE = "sandboxd-disktool:1"
MiB = 1024 * 1024


def _detach_loops(root: Path) -> None:
    """Detach the host loop devices the private engine's disk images are on (only those)."""
    for image in root.glob("data/volumes/sandboxd-disk-*/_data/disk.img"):
        found = subprocess.run(
            ["losetup", "-n", "-O", "NAME", "-j", str(image)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        for device in found:
            subprocess.run(["losetup", "-d", device], capture_output=True, check=False)


@pytest.fixture
def private() -> Iterator[PrivateEngine]:
    import tempfile

    if subprocess.run(
        ["docker", "image", "inspect", DISK_TOOL_IMAGE], capture_output=True
    ).returncode:
        pytest.skip(f"the disk tool image {DISK_TOOL_IMAGE} is not built (make disk-image)")
    engine = PrivateEngine(Path(tempfile.mkdtemp(prefix="sbxvol-")))
    try:
        engine.start()
        for image in (IMAGE, DISK_TOOL_IMAGE):
            saved = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
            assert saved.stdout is not None
            with saved.stdout:
                engine.docker("load", stdin=saved.stdout)
            assert saved.wait(60) == 0
        yield engine
    finally:
        _detach_loops(engine.root)
        engine.cleanup()


def test_a_volume_outlives_an_engine_restart(private: PrivateEngine, tmp_path: Path) -> None:
    owner = "volrst" + secrets.token_hex(3)
    server = start_server(tmp_path, owner, "--docker-host", private.host)
    stubs = make_stubs(server.address)
    volumes = volumes_pb2_grpc.VolumeServiceStub(stubs.channel)
    mount = volumes_pb2.VolumeMount(volume_id="kept", path="/mnt/kept")
    shell = common_pb2.ShellPolicy(allow_all=True)

    def session(sid: str) -> None:
        stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(session_id=sid, shell=shell, volumes=[mount]),
            timeout=120,
        )

    def sh(sid: str, script: str) -> process_pb2.RunResponse:
        return stubs.processes.Run(
            process_pb2.RunRequest(session_id=sid, argv=["sh", "-c", script]), timeout=120
        )

    try:
        volumes.CreateVolume(
            volumes_pb2.CreateVolumeRequest(volume_id="kept", size_bytes=32 * MiB), timeout=120
        )
        session("before")
        assert sh("before", "echo survived > /mnt/kept/f").exit_code == 0
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id="before"))

        private.stop()
        assert wait_for_health(stubs, NOT_SERVING, timeout=10) < 10
        private.start()
        assert wait_for_health(stubs, SERVING, timeout=20) < 20, server.log()

        session("after")
        read = sh("after", "cat /mnt/kept/f")
        assert read.stdout == b"survived\n", read.stderr
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id="after"))
        deleted = volumes.DeleteVolume(volumes_pb2.DeleteVolumeRequest(volume_id="kept"))
        assert deleted.existed
        assert list(private.root.glob("data/volumes/sandboxd-disk-*")) == []
    finally:
        stubs.channel.close()
        server.stop()
