"""A volume mounted directly below /workspace on the real engine (runc): the file calls work
through it, and every tar path of the workspace leaves it out (ExportArchive of the root,
CreateSnapshot, a suspend and resume of the tmpfs workspace, a fork), the restore's replace
sparing its mount point and its files; an ImportArchive into it is refused, nothing changed."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator

import grpc
import pytest
from conftest import expect_error, gvisor_registered
from sandboxd.v1 import (
    common_pb2,
    filesystem_pb2,
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
    volumes_pb2,
)
from test_volumes_engine import (
    CALL_TIMEOUT,
    OK,
    Box,
    _create_volume,
    _delete,
    _mount,
    _session,
    _sh,
)
from test_volumes_engine import box as box  # noqa: F401 - the module's server fixture


def _names(chunks: Iterator[bytes]) -> list[str]:
    data = b"".join(chunks)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return sorted(m.name.removeprefix("./") for m in tar.getmembers())


@pytest.mark.parametrize("tier", ["runc", "gvisor"])
def test_a_volume_below_the_workspace_is_left_out_of_every_tar(box: Box, tier: str) -> None:  # noqa: F811
    if tier == "gvisor" and not gvisor_registered():
        pytest.skip("runsc is not registered with this engine")
    isolation = common_pb2.ISOLATION_GVISOR if tier == "gvisor" else common_pb2.ISOLATION_RUNC
    volume = _create_volume(box, f"inws-{tier}").volume_id
    sid = _session(box, f"ws-vol-{tier}", _mount(volume, "/workspace/data"), isolation=isolation)
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(box.stubs.channel)
    try:
        assert _sh(box, sid, "echo mine > a.txt; echo vol > data/v.txt").exit_code == 0
        # The file calls through the mount.
        box.stubs.files.WriteFile(
            filesystem_pb2.WriteFileRequest(session_id=sid, path="data/w.txt", content=b"w"),
            timeout=CALL_TIMEOUT,
        )
        got = box.stubs.files.ReadFile(
            filesystem_pb2.ReadFileRequest(session_id=sid, path="data/v.txt"),
            timeout=CALL_TIMEOUT,
        )
        assert got.content == b"vol\n"
        listed = box.stubs.files.ListDir(
            filesystem_pb2.ListDirRequest(session_id=sid, path="data"), timeout=CALL_TIMEOUT
        )
        assert sorted(e.name for e in listed.entries) == ["v.txt", "w.txt"]
        # ExportArchive of the root and a snapshot: the workspace without the volume.
        exported = _names(
            c.chunk.data
            for c in snaps.ExportArchive(
                snapshot_pb2.ExportArchiveRequest(session_id=sid, path="."),
                timeout=CALL_TIMEOUT,
            )
        )
        assert exported == ["a.txt"]
        snap = snaps.CreateSnapshot(
            snapshot_pb2.CreateSnapshotRequest(session_id=sid), timeout=CALL_TIMEOUT
        ).snapshot
        downloaded = _names(
            c.chunk.data
            for c in snaps.DownloadSnapshot(
                snapshot_pb2.DownloadSnapshotRequest(snapshot_id=snap.snapshot_id),
                timeout=CALL_TIMEOUT,
            )
        )
        assert downloaded == ["a.txt"]
        # Suspend and resume: the tar restored around the mount point, the volume's files kept.
        box.stubs.sessions.SuspendSession(
            session_pb2.SuspendSessionRequest(session_id=sid), timeout=CALL_TIMEOUT
        )
        box.stubs.sessions.ResumeSession(
            session_pb2.ResumeSessionRequest(session_id=sid), timeout=CALL_TIMEOUT
        )
        out = _sh(box, sid, "cat a.txt data/v.txt data/w.txt").stdout
        assert out == b"mine\nvol\nw"
        # An archive into the volume is refused, nothing changed.
        for path in ("data", "."):
            member = "v.txt" if path == "data" else "data/v.txt"
            expect_error(
                lambda p=path, m=member: snaps.ImportArchive(
                    iter(_import(sid, p, m)), timeout=CALL_TIMEOUT
                ),
                OK.FAILED_PRECONDITION,
                "IMPORT_INTO_VOLUME",
            )
        assert _sh(box, sid, "cat data/v.txt").stdout == b"vol\n"
        # A fork of the snapshot (no volume of its own): the workspace, no volume folder.
        fork = _session(
            box, f"ws-vol-fork-{tier}", from_snapshot_id=snap.snapshot_id, isolation=isolation
        )
        assert _sh(box, fork, "ls").stdout == b"a.txt\n"
        _delete(box, fork)
    finally:
        _delete(box, sid)
        box.volumes.DeleteVolume(volumes_pb2.DeleteVolumeRequest(volume_id=volume))


def _import(sid: str, path: str, member: str) -> list[snapshot_pb2.ImportArchiveRequest]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(member)
        info.size = 3
        tar.addfile(info, io.BytesIO(b"new"))
    header = snapshot_pb2.ImportArchiveHeader(session_id=sid, path=path)
    return [
        snapshot_pb2.ImportArchiveRequest(header=header),
        snapshot_pb2.ImportArchiveRequest(data=buf.getvalue()),
    ]


@pytest.mark.parametrize("path", ["/workspace", "/workspace/a/b", "/workspace/.sbx-import-1"])
def test_a_mount_over_the_workspace_or_deeper_is_refused(box: Box, path: str) -> None:  # noqa: F811
    _create_volume(box, "badws")
    expect_error(
        lambda: _session(box, "bad-ws", _mount("badws", path)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "MOUNT_PATH_INVALID",
    )
