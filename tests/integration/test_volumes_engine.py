"""Named volumes on the real engine, over a real server port: a volume outlives its sessions
and a server restart (SIGKILL, started again), one writer or many readers, DeleteVolume of a
mounted volume refused, a volume filled to its size (ENOSPC inside, WORKSPACE_FULL from the
API, readable and mountable after), export and import as tar streams (all or nothing, refused
while mounted), the sweep leaving a volume's disk alone, and the same mounts under gVisor."""

from __future__ import annotations

import contextlib
import io
import secrets
import signal
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from conftest import (
    IMAGE,
    ServerProcess,
    Stubs,
    expect_error,
    gvisor_registered,
    make_stubs,
    remove_owned_containers,
    remove_owned_disks,
    start_server,
)
from sandboxd.v1 import (
    admin_pb2,
    common_pb2,
    process_pb2,
    session_pb2,
    volumes_pb2,
    volumes_pb2_grpc,
)

MiB = 1024 * 1024
CALL_TIMEOUT = 180.0
OK = grpc.StatusCode


@dataclass
class Box:
    tmp: Path
    owner: str
    srv: ServerProcess
    stubs: Stubs

    @property
    def volumes(self) -> volumes_pb2_grpc.VolumeServiceStub:
        return volumes_pb2_grpc.VolumeServiceStub(self.stubs.channel)

    def restart(self) -> None:
        self.srv.stop(signal.SIGKILL)
        self.stubs.channel.close()
        self.srv = start_server(self.tmp, self.owner)
        self.stubs = make_stubs(self.srv.address)


def _delete_everything(box: Box) -> None:
    """What a failed test left, through the API: sessions, then volumes (a deleted volume's
    disk is detached from its loop device, which removing engine volumes would not do)."""
    listed = box.stubs.sessions.ListSessions(session_pb2.ListSessionsRequest(page_size=1000))
    for s in listed.sessions:
        with contextlib.suppress(grpc.RpcError):
            _delete(box, s.session_id)
    for v in box.volumes.ListVolumes(volumes_pb2.ListVolumesRequest(page_size=1000)).volumes:
        with contextlib.suppress(grpc.RpcError):
            box.volumes.DeleteVolume(volumes_pb2.DeleteVolumeRequest(volume_id=v.volume_id))


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    owner = "vol" + secrets.token_hex(4)
    tmp = tmp_path_factory.mktemp("volumes")
    srv = start_server(tmp, owner)
    b = Box(tmp, owner, srv, make_stubs(srv.address))
    try:
        yield b
    finally:
        _delete_everything(b)
        b.stubs.channel.close()
        b.srv.stop()
        remove_owned_containers(owner)
        remove_owned_containers(owner + "-porter")
        remove_owned_disks(owner)  # detached first, as the server deletes a disk


def _create_volume(box: Box, volume_id: str, size: int = 32 * MiB) -> volumes_pb2.Volume:
    return box.volumes.CreateVolume(
        volumes_pb2.CreateVolumeRequest(volume_id=volume_id, size_bytes=size),
        timeout=CALL_TIMEOUT,
    ).volume


def _session(box: Box, sid: str, *mounts: volumes_pb2.VolumeMount, **fields: object) -> str:
    box.stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            session_id=sid,
            shell=common_pb2.ShellPolicy(allow_all=True),
            volumes=list(mounts),
            **fields,  # type: ignore[arg-type]
        ),
        timeout=CALL_TIMEOUT,
    )
    return sid


def _delete(box: Box, sid: str) -> None:
    box.stubs.sessions.DeleteSession(
        session_pb2.DeleteSessionRequest(session_id=sid), timeout=CALL_TIMEOUT
    )


def _mount(
    volume_id: str, path: str = "/mnt/data", read_only: bool = False
) -> volumes_pb2.VolumeMount:
    return volumes_pb2.VolumeMount(volume_id=volume_id, path=path, read_only=read_only)


def _sh(box: Box, sid: str, script: str) -> process_pb2.RunResponse:
    return box.stubs.processes.Run(
        process_pb2.RunRequest(session_id=sid, argv=["sh", "-c", script]), timeout=CALL_TIMEOUT
    )


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _import(box: Box, volume_id: str, data: bytes, replace: bool = False) -> volumes_pb2.Volume:
    def requests() -> Iterator[volumes_pb2.ImportVolumeRequest]:
        yield volumes_pb2.ImportVolumeRequest(
            header=volumes_pb2.ImportVolumeHeader(volume_id=volume_id, replace=replace)
        )
        for i in range(0, len(data), 256 * 1024):
            yield volumes_pb2.ImportVolumeRequest(data=data[i : i + 256 * 1024])

    return box.volumes.ImportVolume(requests(), timeout=CALL_TIMEOUT).volume


def _export(box: Box, volume_id: str) -> dict[str, bytes]:
    data = b"".join(
        r.data
        for r in box.volumes.ExportVolume(
            volumes_pb2.ExportVolumeRequest(volume_id=volume_id), timeout=CALL_TIMEOUT
        )
    )
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {
            m.name.removeprefix("./"): tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def test_a_volume_outlives_its_sessions_and_a_server_restart(box: Box) -> None:
    _create_volume(box, "keep")
    _session(box, "w1", _mount("keep"))
    wrote = _sh(
        box, "w1", "mkdir /mnt/data/d && echo kept > /mnt/data/d/f && chmod 600 /mnt/data/d/f"
    )
    assert wrote.exit_code == 0, wrote.stderr
    # A second writer, or a reader beside the writer, is refused; DeleteVolume too.
    for mount in (_mount("keep", "/mnt/x"), _mount("keep", "/mnt/x", read_only=True)):
        err = expect_error(
            lambda m=mount: _session(box, "w2", m), OK.FAILED_PRECONDITION, "VOLUME_IN_USE"
        )
        assert "w1" in err.details()  # type: ignore[attr-defined]
    expect_error(
        lambda: box.volumes.DeleteVolume(volumes_pb2.DeleteVolumeRequest(volume_id="keep")),
        OK.FAILED_PRECONDITION,
        "VOLUME_IN_USE",
    )
    got = box.volumes.GetVolume(volumes_pb2.GetVolumeRequest(volume_id="keep")).volume
    assert [(a.session_id, a.read_only) for a in got.attached] == [("w1", False)]
    assert got.size_bytes == 32 * MiB and 0 < got.used_bytes < 32 * MiB  # sparse
    _delete(box, "w1")
    box.restart()
    # The next writer (another host uid) owns what the last one made, mode 600 and all.
    _session(box, "w2", _mount("keep", "/mnt/a/b"))
    read = _sh(
        box,
        "w2",
        "cat /mnt/a/b/d/f && echo more >> /mnt/a/b/d/f && id -u && stat -c %u /mnt/a/b/d/f"
        " && echo shared > /mnt/a/b/shared && chmod 644 /mnt/a/b/shared",
    )
    assert read.exit_code == 0, read.stderr
    text = read.stdout.decode().split()
    assert text[0] == "kept" and text[1] == text[2]
    _delete(box, "w2")
    # Readers share it, and cannot write; a writer waits for them.
    _session(box, "r1", _mount("keep", read_only=True))
    _session(box, "r2", _mount("keep", read_only=True))
    # Readers are other uids: they read what the files' modes let others read (not the 600).
    seen = _sh(box, "r2", "cat /mnt/data/shared; ls /mnt/data; cat /mnt/data/d/f")
    assert seen.stdout.decode().split() == ["shared", "d", "shared"], seen.stderr
    assert b"Permission denied" in seen.stderr
    ro = _sh(box, "r1", "touch /mnt/data/new")
    assert ro.exit_code != 0 and b"Read-only file system" in ro.stderr
    expect_error(
        lambda: _session(box, "w3", _mount("keep")), OK.FAILED_PRECONDITION, "VOLUME_IN_USE"
    )
    _delete(box, "r1")
    _delete(box, "r2")
    assert box.volumes.DeleteVolume(volumes_pb2.DeleteVolumeRequest(volume_id="keep")).existed
    assert not box.volumes.DeleteVolume(volumes_pb2.DeleteVolumeRequest(volume_id="keep")).existed
    expect_error(
        lambda: box.volumes.GetVolume(volumes_pb2.GetVolumeRequest(volume_id="keep")),
        OK.NOT_FOUND,
        "VOLUME_NOT_FOUND",
    )


def test_a_full_volume_is_enospc_inside_workspace_full_outside_and_readable_after(
    box: Box,
) -> None:
    _create_volume(box, "full", 16 * MiB)
    _session(box, "f1", _mount("full"), limits=common_pb2.ResourceLimits(memory_bytes=64 * MiB))
    filled = _sh(
        box, "f1", "echo first > /mnt/data/first; dd if=/dev/zero of=/mnt/data/big bs=1M count=64"
    )
    assert filled.exit_code != 0 and b"No space left" in filled.stderr, filled.stderr
    _delete(box, "f1")
    # From the API: an import into the full volume is WORKSPACE_FULL, and changes nothing.
    big = _tar({"more.bin": b"\1" * (4 * MiB)})
    expect_error(lambda: _import(box, "full", big), OK.RESOURCE_EXHAUSTED, "WORKSPACE_FULL")
    _session(box, "f2", _mount("full", read_only=True))
    after = _sh(box, "f2", "cat /mnt/data/first; ls /mnt/data")
    assert after.exit_code == 0 and after.stdout.decode().split() == ["first", "big", "first"]
    _delete(box, "f2")
    box.volumes.DeleteVolume(volumes_pb2.DeleteVolumeRequest(volume_id="full"))


def test_export_and_import_are_tar_streams_all_or_nothing(box: Box) -> None:
    _create_volume(box, "port")
    done = _import(box, "port", _tar({"a.txt": b"alpha", "sub/b.txt": b"beta"}))
    assert done.volume_id == "port"
    assert _export(box, "port") == {"a.txt": b"alpha", "sub/b.txt": b"beta"}
    # A hostile member refuses the whole archive: nothing of it lands.
    hostile = _tar({"c.txt": b"gamma", "../escape": b"x"})
    expect_error(lambda: _import(box, "port", hostile), OK.INVALID_ARGUMENT)
    assert _export(box, "port") == {"a.txt": b"alpha", "sub/b.txt": b"beta"}
    _import(box, "port", _tar({"only.txt": b"new"}), replace=True)
    assert _export(box, "port") == {"only.txt": b"new"}
    # Mounted: an import is refused; an export beside readers is not, beside a writer it is.
    _session(box, "p1", _mount("port", read_only=True))
    expect_error(
        lambda: _import(box, "port", _tar({"z": b"z"})), OK.FAILED_PRECONDITION, "VOLUME_IN_USE"
    )
    assert _export(box, "port") == {"only.txt": b"new"}
    _delete(box, "p1")
    _session(box, "p2", _mount("port"))
    seen = _sh(box, "p2", "cat /mnt/data/only.txt")
    assert seen.stdout == b"new"
    expect_error(lambda: _export(box, "port"), OK.FAILED_PRECONDITION, "VOLUME_IN_USE")
    _delete(box, "p2")
    box.volumes.DeleteVolume(volumes_pb2.DeleteVolumeRequest(volume_id="port"))


def test_a_suspended_session_keeps_its_volume_and_mounts_it_again(box: Box) -> None:
    _create_volume(box, "susp")
    _session(box, "s1", _mount("susp"))
    assert _sh(box, "s1", "echo before > /mnt/data/f").exit_code == 0
    box.stubs.sessions.SuspendSession(
        session_pb2.SuspendSessionRequest(session_id="s1"), timeout=CALL_TIMEOUT
    )
    # Suspended, it still holds its claim: no other writer meanwhile.
    expect_error(
        lambda: _session(box, "s2", _mount("susp")), OK.FAILED_PRECONDITION, "VOLUME_IN_USE"
    )
    box.stubs.sessions.ResumeSession(
        session_pb2.ResumeSessionRequest(session_id="s1"), timeout=CALL_TIMEOUT
    )
    after = _sh(box, "s1", "cat /mnt/data/f && echo again >> /mnt/data/f")
    assert after.exit_code == 0 and after.stdout == b"before\n", after.stderr
    _delete(box, "s1")
    box.volumes.DeleteVolume(volumes_pb2.DeleteVolumeRequest(volume_id="susp"))


def test_bad_requests_are_refused_before_anything_is_made(box: Box) -> None:
    for size in (-1, 1, 21 * 1024 * MiB):
        expect_error(
            lambda s=size: _create_volume(box, "bad", s), OK.INVALID_ARGUMENT, "VOLUME_SIZE_INVALID"
        )
    for volume_id in ("a/b", "x" * 300, "dаta"):
        expect_error(
            lambda v=volume_id: _create_volume(box, v), OK.INVALID_ARGUMENT, "INVALID_VOLUME_ID"
        )
    _create_volume(box, "paths")
    for path in ("/workspace", "/workspace/a/b", "/mnt", "/etc/x", "/mnt/../etc", "/mnt/a/"):
        expect_error(
            lambda p=path: _session(box, "bad", _mount("paths", p)),
            OK.INVALID_ARGUMENT,
            "MOUNT_PATH_INVALID",
        )
    _create_volume(box, "paths2")
    expect_error(
        lambda: _session(box, "bad", _mount("paths", "/mnt/a"), _mount("paths2", "/mnt/a/b")),
        OK.INVALID_ARGUMENT,
        "MOUNT_PATH_INVALID",
    )
    expect_error(lambda: _session(box, "bad", _mount("nope")), OK.NOT_FOUND, "VOLUME_NOT_FOUND")
    expect_error(
        lambda: box.stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id="bad")),
        OK.NOT_FOUND,
    )
    # The sweep leaves every disk a volume owns.
    box.stubs.admin.Sweep(admin_pb2.SweepRequest(), timeout=CALL_TIMEOUT)
    _session(box, "still", _mount("paths"), _mount("paths2", "/mnt/other"))
    assert _sh(box, "still", "ls -d /mnt/data /mnt/other").exit_code == 0
    _delete(box, "still")
    for volume_id in ("paths", "paths2"):
        box.volumes.DeleteVolume(volumes_pb2.DeleteVolumeRequest(volume_id=volume_id))


def test_the_sweep_leaves_a_disk_tool_run_alone(box: Box) -> None:
    """A disk tool container (making, attaching or measuring a volume's disk) carries the
    server's owner id but is no sandbox: a sweep during its run must not take it for an
    orphan (it did: a volume's import failed with the tool's container removed under it)."""
    name = f"sandboxd-tooltest-{secrets.token_hex(4)}"
    labels = ["--label", f"io.sandboxd.owner={box.owner}", "--label", "io.sandboxd.disk-tool=usage"]
    subprocess.run(
        ["docker", "run", "-d", "--name", name, "--network", "none", *labels, IMAGE, "sleep", "60"],
        capture_output=True,
        check=True,
    )
    try:
        box.stubs.admin.Sweep(admin_pb2.SweepRequest(), timeout=CALL_TIMEOUT)
        running = subprocess.run(
            ["docker", "inspect", "--format", "{{.State.Running}}", name],
            capture_output=True,
            text=True,
            check=False,
        )
        assert running.stdout.strip() == "true", running.stderr
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


@pytest.mark.skipif(not gvisor_registered(), reason="runsc is not registered with the engine")
def test_volumes_under_gvisor(box: Box) -> None:
    _create_volume(box, "gv")
    gvisor = common_pb2.ISOLATION_GVISOR
    _session(box, "g1", _mount("gv"), isolation=gvisor)
    wrote = _sh(
        box,
        "g1",
        "echo under-gvisor > /mnt/data/g && dd if=/dev/zero of=/mnt/data/big bs=1M count=64",
    )
    assert b"No space left" in wrote.stderr, wrote.stderr
    _delete(box, "g1")
    _session(box, "g2", _mount("gv", read_only=True), isolation=gvisor)
    assert _sh(box, "g2", "cat /mnt/data/g").stdout == b"under-gvisor\n"
    _delete(box, "g2")
    box.volumes.DeleteVolume(volumes_pb2.DeleteVolumeRequest(volume_id="gv"))
