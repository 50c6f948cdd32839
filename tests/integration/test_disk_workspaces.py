"""Disk workspaces on the real engine, under runc and gVisor: a sparse ext4 disk of the size
asked, not counted against memory (4 GiB written by a session of 256 MiB), its quota enforced
by the kernel (ENOSPC inside, WORKSPACE_FULL from the API, another session unaffected), kept in
place by a suspend (no tar), a killed container rebuilt on it with its files, forked through a
snapshot; bad sizes and a disk larger than the engine host's free space refused with nothing
made; every volume and loop device gone with its session."""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import (
    ServerProcess,
    Stubs,
    expect_error,
    make_stubs,
    own_server,
    run,
)
from google.protobuf import duration_pb2
from sandboxd.v1 import (
    common_pb2,
    filesystem_pb2,
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

TIERS = ("runc", "gvisor")
MiB, GiB = 1024 * 1024, 1024 * 1024 * 1024
DISK = session_pb2.WORKSPACE_STORAGE_DISK
LONG = duration_pb2.Duration(seconds=600)


@pytest.fixture(scope="module")
def disk_server(tier: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose disks may be as large as a disk can be (16 TiB): the engine host's free
    space, not the maximum, is what refuses the largest."""
    owner = "test" + secrets.token_hex(4)
    extra = ["--max-disk-bytes", "16384g", "--max-command-timeout-s", "900"]
    if tier != "runc":
        extra += ["--isolation-default", tier]
    with own_server(tmp_path_factory.mktemp("data"), owner, *extra) as srv:
        yield srv
    assert _volumes(srv.owner_id) == [], "disk volumes left behind"


@pytest.fixture(scope="module")
def dstubs(disk_server: ServerProcess) -> Iterator[Stubs]:
    stubs = make_stubs(disk_server.address)
    yield stubs
    stubs.channel.close()


@pytest.fixture
def disk_session(dstubs: Stubs) -> Iterator[object]:
    made: list[str] = []

    def make(size: int = 256 * MiB, **fields: object) -> session_pb2.Session:
        fields.setdefault("shell", common_pb2.ShellPolicy(allow_all=True))
        workspace = session_pb2.WorkspaceManifest(storage=DISK, size_bytes=size)
        req = session_pb2.CreateSessionRequest(workspace=workspace, **fields)  # type: ignore[arg-type]
        session = dstubs.sessions.CreateSession(req).session
        made.append(session.session_id)
        return session

    yield make
    for sid in made:
        with contextlib.suppress(grpc.RpcError):
            dstubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


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


def _container(owner: str, session_id: str) -> dict[str, object]:
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=io.sandboxd.owner={owner}"]
        + ["--filter", f"label=io.sandboxd.session={session_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(ids) == 1, ids
    out = subprocess.run(["docker", "inspect", ids[0]], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[0]  # type: ignore[no-any-return]


def _disk_id(owner: str, session_id: str) -> str:
    mounts = [
        m for m in _container(owner, session_id)["Mounts"] if m["Destination"] == "/workspace"
    ]  # type: ignore[index,attr-defined]
    assert len(mounts) == 1 and mounts[0]["Type"] == "volume", mounts
    labels = json.loads(
        subprocess.run(
            ["docker", "volume", "inspect", "--format", "{{json .Labels}}", mounts[0]["Name"]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    return str(labels["io.sandboxd.disk"])


def _allocated(disk_id: str) -> int:
    """Bytes the disk's image file takes on the engine host (this host: the tests' engine)."""
    point = subprocess.run(
        ["docker", "volume", "inspect", "--format", "{{.Mountpoint}}", f"sandboxd-disk-{disk_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return (Path(point) / "disk.img").stat().st_blocks * 512


def _sh(stubs: Stubs, sid: str, script: str) -> tuple[int, str, str]:
    got = run(stubs, sid, "sh", "-c", script, timeout=LONG)
    return got.exit_code, got.stdout.decode(), got.stderr.decode()


def test_a_session_of_256_mib_writes_4_gib_into_a_sparse_disk(
    dstubs: Stubs, disk_server: ServerProcess, disk_session: object
) -> None:
    limits = common_pb2.ResourceLimits(memory_bytes=256 * MiB, command_timeout=LONG)
    made = disk_session(size=5 * GiB, limits=limits)  # type: ignore[operator]
    assert made.workspace_storage == DISK and made.workspace_size_bytes == 5 * GiB
    assert made.limits.memory_bytes == 256 * MiB
    disk_id = _disk_id(disk_server.owner_id, made.session_id)
    assert _allocated(disk_id) < 64 * MiB  # an empty 5 GiB disk costs a few MiB
    code, out, err = _sh(
        dstubs,
        made.session_id,
        # Read back with dd: busybox cat copies nothing of a file of exactly 4 GiB.
        "dd if=/dev/zero of=/workspace/big bs=1M count=4096 2>/dev/null && sync && "
        "stat -c %s /workspace/big && dd if=/workspace/big of=/dev/null bs=1M 2>&1 | head -n 1",
    )
    assert code == 0, (out, err)
    assert out.split("\n")[:2] == [str(4 * GiB), "4096+0 records in"], out
    assert _allocated(disk_id) >= 4 * GiB
    state = dstubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=made.session_id))
    assert state.session.state == session_pb2.SESSION_STATE_RUNNING  # no OOM, no loss
    dstubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=made.session_id))
    assert _volumes(disk_server.owner_id, disk_id) == []


def test_the_disk_is_the_sandbox_users_own_empty_folder(
    dstubs: Stubs, disk_session: object, tier: str
) -> None:
    made = disk_session()  # type: ignore[operator]
    code, out, _ = _sh(
        dstubs,
        made.session_id,
        "stat -c '%a %u:%g' /workspace; ls -A /workspace | wc -l; id -u; "
        "cp /bin/busybox /workspace/true && /workspace/true && echo exec-ok",
    )
    mode_owner, entries, uid, exec_ok = out.split("\n")[:4]
    assert code == 0 and mode_owner == f"700 {made.user}" and entries == "0"
    assert uid == made.user.split(":")[0] and exec_ok == "exec-ok"  # exec, as in the tmpfs
    if tier == "runc":  # gVisor's /proc/mounts shows its own view
        _, mounts, _ = _sh(dstubs, made.session_id, "grep ' /workspace ' /proc/mounts")
        options = mounts.split()[3].split(",")
        assert mounts.split()[2] == "ext4" and {"nosuid", "nodev"} <= set(options)


def test_a_full_disk_is_enospc_inside_and_workspace_full_outside(
    dstubs: Stubs, disk_session: object
) -> None:
    full = disk_session(size=64 * MiB)  # type: ignore[operator]
    other = disk_session(size=64 * MiB)  # type: ignore[operator]
    code, out, err = _sh(
        dstubs, full.session_id, "dd if=/dev/zero of=/workspace/fill bs=1M count=100"
    )
    assert code != 0 and "No space left on device" in out + err
    write = filesystem_pb2.WriteFileRequest(
        session_id=full.session_id, path="more.bin", content=b"x" * MiB
    )
    expect_error(
        lambda: dstubs.files.WriteFile(write), grpc.StatusCode.RESOURCE_EXHAUSTED, "WORKSPACE_FULL"
    )
    # Another session writes what it likes, and the full one is readable and usable again.
    code, _, _ = _sh(dstubs, other.session_id, "dd if=/dev/zero of=/workspace/f bs=1M count=32")
    assert code == 0
    code, out, _ = _sh(
        dstubs, full.session_id, "rm /workspace/fill && echo ok > /workspace/a && cat /workspace/a"
    )
    assert code == 0 and out == "ok\n"


def test_suspend_keeps_the_disk_and_resume_mounts_it_without_a_snapshot(
    dstubs: Stubs, disk_session: object, disk_server: ServerProcess
) -> None:
    made = disk_session()  # type: ignore[operator]
    sid = made.session_id
    assert _sh(dstubs, sid, "echo kept > /workspace/k && mkdir -p /workspace/d/e")[0] == 0
    dstubs.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=sid))
    snapshots = snapshot_pb2_grpc.SnapshotServiceStub(dstubs.channel)
    listed = snapshots.ListSnapshots(snapshot_pb2.ListSnapshotsRequest(session_id=sid))
    assert list(listed.snapshots) == []  # no tar round trip
    back = dstubs.sessions.ResumeSession(session_pb2.ResumeSessionRequest(session_id=sid))
    assert back.session.state == session_pb2.SESSION_STATE_RUNNING
    code, out, _ = _sh(dstubs, sid, "cat /workspace/k; ls -d /workspace/d/e")
    assert code == 0 and out == "kept\n/workspace/d/e\n"


def test_a_killed_container_is_rebuilt_on_its_disk_with_every_file(
    dstubs: Stubs, disk_session: object, disk_server: ServerProcess
) -> None:
    made = disk_session()  # type: ignore[operator]
    sid = made.session_id
    assert _sh(dstubs, sid, "echo unsaved > /workspace/work.txt")[0] == 0
    container = _container(disk_server.owner_id, sid)
    subprocess.run(["docker", "rm", "-f", str(container["Id"])], capture_output=True, check=True)
    deadline = time.monotonic() + 60
    while True:  # the first call (or the sweep) finds it lost; a later one rebuilds it
        try:
            code, out, _ = _sh(dstubs, sid, "cat /workspace/work.txt")
            break
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION)
            assert time.monotonic() < deadline, exc
            time.sleep(0.5)
    assert code == 0 and out == "unsaved\n"
    got = dstubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=sid)).session
    assert got.HasField("lost_time") and got.restored_from == "workspace-disk"
    assert "every file" in got.lost_message


def test_a_fork_of_a_disk_workspace_has_its_files_on_its_own_disk(
    dstubs: Stubs, disk_session: object, disk_server: ServerProcess
) -> None:
    source = disk_session()  # type: ignore[operator]
    assert _sh(dstubs, source.session_id, "echo forked > /workspace/f.txt")[0] == 0
    snapshots = snapshot_pb2_grpc.SnapshotServiceStub(dstubs.channel)
    snap = snapshots.CreateSnapshot(
        snapshot_pb2.CreateSnapshotRequest(session_id=source.session_id)
    ).snapshot
    try:
        fork = disk_session(from_snapshot_id=snap.snapshot_id)  # type: ignore[operator]
        assert _disk_id(disk_server.owner_id, fork.session_id) != _disk_id(
            disk_server.owner_id, source.session_id
        )
        code, out, _ = _sh(
            dstubs, fork.session_id, "cat /workspace/f.txt; echo mine > /workspace/f.txt"
        )
        assert code == 0 and out == "forked\n"
        assert _sh(dstubs, source.session_id, "cat /workspace/f.txt")[1] == "forked\n"
    finally:
        snapshots.DeleteSnapshot(snapshot_pb2.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id))


@pytest.mark.parametrize(
    ("size", "code", "reason"),
    [
        (-1, grpc.StatusCode.INVALID_ARGUMENT, "LIMIT_INVALID"),
        (16384 * GiB + 1, grpc.StatusCode.INVALID_ARGUMENT, "LIMIT_EXCEEDS_MAXIMUM"),
        # Far more than this engine host has free: refused at create, nothing made.
        (16384 * GiB, grpc.StatusCode.RESOURCE_EXHAUSTED, "ENGINE_DISK_FULL"),
    ],
)
def test_bad_sizes_and_a_disk_past_the_free_space_are_refused_with_nothing_made(
    dstubs: Stubs,
    disk_server: ServerProcess,
    size: int,
    code: grpc.StatusCode,
    reason: str,
) -> None:
    sid = "disk-refused-" + secrets.token_hex(3)
    workspace = session_pb2.WorkspaceManifest(storage=DISK, size_bytes=size)
    req = session_pb2.CreateSessionRequest(session_id=sid, workspace=workspace)
    err = expect_error(lambda: dstubs.sessions.CreateSession(req), code, reason)
    assert "size" in err.details() or "free" in err.details()  # type: ignore[attr-defined]
    get = session_pb2.GetSessionRequest(session_id=sid)
    expect_error(lambda: dstubs.sessions.GetSession(get), grpc.StatusCode.NOT_FOUND)
    assert _volumes(disk_server.owner_id) == []


def test_export_import_and_a_template_work_on_a_disk_workspace(
    dstubs: Stubs, disk_session: object
) -> None:
    snapshots = snapshot_pb2_grpc.SnapshotServiceStub(dstubs.channel)
    source = disk_session()  # type: ignore[operator]
    assert (
        _sh(dstubs, source.session_id, "mkdir -p /workspace/p && echo x > /workspace/p/a")[0] == 0
    )
    exported = b"".join(
        r.chunk.data
        for r in snapshots.ExportArchive(
            snapshot_pb2.ExportArchiveRequest(session_id=source.session_id)
        )
    )
    target = disk_session(template="python")  # type: ignore[operator]

    def upload() -> Iterator[snapshot_pb2.ImportArchiveRequest]:
        header = snapshot_pb2.ImportArchiveHeader(session_id=target.session_id, path="in")
        yield snapshot_pb2.ImportArchiveRequest(header=header)
        yield snapshot_pb2.ImportArchiveRequest(data=exported)

    snapshots.ImportArchive(upload())
    code, out, err = _sh(
        dstubs,
        target.session_id,
        "cat /workspace/in/p/a && python3 -c \"open('/workspace/py.txt','w').write('ok')\" "
        "&& cat /workspace/py.txt",
    )
    assert code == 0 and out == "x\nok", (out, err)
