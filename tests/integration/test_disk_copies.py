"""Disk snapshots, forks, the warm pool and the tenant disk quota on the real engine (runc): a
snapshot of a disk workspace is a sparse copy the engine keeps (its own volume, no tar), a fork
of it runs as its own host uid on a copy of its own, DownloadSnapshot refuses it, DeleteSnapshot
removes its volume; a pool of disk members hands one out with its disk and uid; a create past
tenant_max_disk_bytes is refused with the remaining bytes, nothing made."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
from conftest import (
    ServerProcess,
    Stubs,
    error_info,
    expect_error,
    make_stubs,
    remove_owned_containers,
    remove_owned_disks,
    run,
    start_server,
    wait_until,
)
from sandboxd.v1 import common_pb2, session_pb2, snapshot_pb2, snapshot_pb2_grpc
from test_pool import metric, pool_members

MiB = 1024 * 1024
DISK = session_pb2.WORKSPACE_STORAGE_DISK
SHELL = common_pb2.ShellPolicy(allow_all=True)


def _volumes(owner: str, disk_id: str = "") -> list[str]:
    label = f"io.sandboxd.disk={disk_id}" if disk_id else "io.sandboxd.disk"
    out = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"label=io.sandboxd.owner={owner}"]
        + ["--filter", f"label={label}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(out.split())


def _sh(stubs: Stubs, sid: str, script: str) -> tuple[int, str]:
    got = run(stubs, sid, "sh", "-c", script)
    return got.exit_code, got.stdout.decode() + got.stderr.decode()


@contextlib.contextmanager
def _server(tmp: Path, *extra: str) -> Iterator[tuple[ServerProcess, Stubs]]:
    owner = "test" + secrets.token_hex(4)
    srv = start_server(tmp, owner, *extra)
    stubs = make_stubs(srv.address)
    try:
        yield srv, stubs
    finally:
        stubs.channel.close()
        srv.stop()
        remove_owned_containers(owner)
        remove_owned_disks(owner)  # detached first: never `docker volume rm` an attached disk


def _create(stubs: Stubs, size: int = 64 * MiB, **fields: object) -> session_pb2.Session:
    workspace = session_pb2.WorkspaceManifest(storage=DISK, size_bytes=size)
    req = session_pb2.CreateSessionRequest(workspace=workspace, shell=SHELL, **fields)  # type: ignore[arg-type]
    return stubs.sessions.CreateSession(req).session


def _delete(stubs: Stubs, sid: str) -> None:
    stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


def test_a_disk_snapshot_is_a_copy_on_the_engine_and_its_fork_runs_as_its_own_uid(
    tmp_path: Path,
) -> None:
    with _server(tmp_path / "data") as (srv, stubs):
        snaps = snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)
        source = _create(stubs)
        assert _sh(stubs, source.session_id, "echo kept > f.txt; mkdir d; echo x > d/y")[0] == 0
        snap = snaps.CreateSnapshot(
            snapshot_pb2.CreateSnapshotRequest(session_id=source.session_id)
        ).snapshot
        assert snap.kind == snapshot_pb2.SNAPSHOT_KIND_DISK and not snap.sha256
        assert _volumes(srv.owner_id, snap.snapshot_id) == [f"sandboxd-disk-{snap.snapshot_id}"]
        assert not list((srv.data_dir / "snapshots").glob("*.tar"))  # no tar on the server
        # The source runs on after its pause; what it writes now is not in the copy.
        assert _sh(stubs, source.session_id, "echo later >> f.txt")[0] == 0
        fork = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(shell=SHELL, from_snapshot_id=snap.snapshot_id)
        ).session
        assert fork.workspace_storage == DISK and fork.workspace_size_bytes == 64 * MiB
        code, out = _sh(
            stubs,
            fork.session_id,
            "cat f.txt d/y; stat -c %u /workspace /workspace/f.txt /workspace/d/y; id -u;"
            " stat -c %a /workspace; echo mine > f.txt && cat f.txt",
        )
        lines = out.split()
        assert code == 0, out
        assert lines[:2] == ["kept", "x"]
        assert lines[2] == lines[3] == lines[4] == lines[5]  # every file the fork's own uid
        assert lines[6:] == ["700", "mine"]
        err = expect_error(
            lambda: list(
                snaps.DownloadSnapshot(
                    snapshot_pb2.DownloadSnapshotRequest(snapshot_id=snap.snapshot_id)
                )
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "SNAPSHOT_NOT_TAR",
        )
        assert "TAR" in err.details()  # type: ignore[attr-defined]
        snaps.DeleteSnapshot(snapshot_pb2.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id))
        assert _volumes(srv.owner_id, snap.snapshot_id) == []
        _delete(stubs, fork.session_id)
        _delete(stubs, source.session_id)
        assert _volumes(srv.owner_id) == []


def test_a_pool_of_disk_members_hands_one_out_with_its_disk_and_uid(tmp_path: Path) -> None:
    with _server(
        tmp_path / "data",
        "--pool-size",
        "1",
        "--default-workspace-storage",
        "disk",
        "--default-disk-bytes",
        "128m",
        "--metrics-listen",
        "127.0.0.1:0",
    ) as (srv, stubs):
        assert wait_until(lambda: metric(srv, "sandboxd_pool_available") >= 1, timeout=90)
        (member,) = [str(c["ID"]) for c in pool_members(srv.owner_id)]
        disks = set(_volumes(srv.owner_id))
        assert len(disks) == 2  # the member's image volume and its mount volume
        session = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(shell=SHELL)
        ).session
        assert metric(srv, 'sandboxd_pool_claims_total{result="hit"}') == 1
        assert session.workspace_storage == DISK
        assert session.workspace_size_bytes == 128 * MiB
        code, out = _sh(stubs, session.session_id, "stat -c %u /workspace; id -u; df -k .")
        lines = out.split("\n")
        assert code == 0 and lines[0] == lines[1], out  # the disk is the member's uid's
        assert 100 * 1024 < int(lines[3].split()[1]) <= 128 * 1024  # 128 MiB, on its disk
        assert any(c["ID"] == member[:12] for c in pool_members(srv.owner_id))
        _delete(stubs, session.session_id)
        assert not disks & set(_volumes(srv.owner_id))  # its disk went with it


def test_a_create_past_the_tenant_disk_quota_is_refused_with_the_room_left(
    tmp_path: Path,
) -> None:
    with _server(tmp_path / "data", "--tenant-max-disk-bytes", "100m") as (srv, stubs):
        first = _create(stubs, 64 * MiB)
        sid = "quota-" + secrets.token_hex(3)
        err = expect_error(
            lambda: _create(stubs, 64 * MiB, session_id=sid),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "TENANT_DISK_QUOTA",
        )
        info = error_info(err)
        assert info.metadata["remainingBytes"] == str(100 * MiB - 64 * MiB)
        assert info.metadata["quotaBytes"] == str(100 * MiB)
        expect_error(
            lambda: stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=sid)),
            grpc.StatusCode.NOT_FOUND,
        )
        assert len(_volumes(srv.owner_id)) == 2  # the first session's disk and mount only
        _delete(stubs, first.session_id)
        _create(stubs, 64 * MiB, session_id=sid)  # the deleted session's room is free again
        _delete(stubs, sid)
