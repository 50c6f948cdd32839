"""Nothing lost, against the real server: answers say what happened, imports are all or nothing,
and what the sandbox makes survives a snapshot (or is refused up front, the session running).

The fuzzer (test_fuzz_workspace.py) searches sequences; these pin single guarantees.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
import time
from pathlib import Path

import grpc
import pytest
from conftest import ServerProcess, SessionFactory, Stubs, expect_error, run
from containers import session_container
from sandboxd.v1 import (
    common_pb2,
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
)
from test_archive import import_tar
from test_fuzz_workspace import TREE_SCRIPT


def _sh(stubs: Stubs, sid: str, script: str) -> bytes:
    r = run(stubs, sid, "sh", "-c", script)
    assert r.exit_code == 0, r.stderr
    return bytes(r.stdout)


def test_plain_exit_130_is_no_signal(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    r = run(stubs, sid, "sh", "-c", "exit 130")
    assert r.exit_code == 130 and r.signal == ""
    r = run(stubs, sid, "sh", "-c", "exit 137")
    assert r.exit_code == 137 and r.signal == ""


def test_death_by_signal_is_reported_from_the_status_record(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    r = run(stubs, sid, "sh", "-c", "kill -INT $$")
    assert r.exit_code == 130 and r.signal == "SIGINT"
    r = run(stubs, sid, "sh", "-c", "kill -KILL $$")
    assert r.exit_code == 137 and r.signal == "SIGKILL"
    # The record is consumed: nothing is left in /tmp for the next command to trip over.
    assert b".sbx-status-" not in _sh(stubs, sid, "ls -a /tmp")


def _dir_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode in (("ro", 0o555), ("ro/sub", 0o500), ("ro/sub/deep", 0o755)):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        info = tarfile.TarInfo("ro/sub/deep/f")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    return buf.getvalue()


def test_import_of_unwritable_directories_keeps_their_modes(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    """tar -x makes a 555 directory before its children: unpacked open, closed after."""
    sid = new_session().session_id
    import_tar(stubs, sid, _dir_tar())
    out = _sh(
        stubs, sid, "cd /workspace && stat -c '%n %a' ro ro/sub ro/sub/deep && cat ro/sub/deep/f"
    )
    assert out == b"ro 555\nro/sub 500\nro/sub/deep 755\nhi"
    # ... and a replace over them removes them whole (the helper opens them up to empty them).
    import_tar(stubs, sid, _dir_tar(), replace=True)
    assert _sh(stubs, sid, "cd /workspace && stat -c '%a' ro") == b"555\n"


def test_refused_import_into_a_missing_folder_leaves_no_folder(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../x")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    expect_error(
        lambda: import_tar(stubs, sid, buf.getvalue(), path="new/deeper"),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert _sh(stubs, sid, "ls -A /workspace") == b""


def test_unreadable_entry_refuses_suspend_up_front(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    """A 000 file cannot be read by tar as the sandbox user: a clear FAILED_PRECONDITION
    before anything is stopped, the session still RUNNING with its files."""
    sid = new_session().session_id
    _sh(stubs, sid, "cd /workspace && printf s > u && chmod 000 u")
    expect_error(
        lambda: stubs.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=sid)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "WORKSPACE_UNREADABLE",
    )
    got = stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=sid)).session
    assert got.state == session_pb2.SESSION_STATE_RUNNING
    assert _sh(stubs, sid, "stat -c %a /workspace/u") == b"0\n"


@pytest.mark.parametrize(
    "script",
    [
        "mkfifo -m 640 p",
        "ln -s /nowhere/at/all dangling && ln -s ../../etc/passwd up",
        "dd if=/dev/zero of=big bs=1024 count=3072 2>/dev/null",  # over the 1 MiB file cap
        "printf x > \"$(printf 'bad\\377name')\"",
    ],
)
def test_restore_takes_back_what_the_sandbox_made(
    stubs: Stubs, new_session: SessionFactory, script: str
) -> None:
    """The server's own snapshot is restored under the trusted rules; the caller's
    ImportArchive of the same tar keeps its stricter ones (a clear refusal, never INTERNAL)."""
    sid = new_session(
        limits=common_pb2.ResourceLimits(file_bytes=1024 * 1024, workspace_bytes=16 << 20)
    ).session_id
    listing = TREE_SCRIPT
    _sh(stubs, sid, "cd /workspace && " + script)
    before = _sh(stubs, sid, listing)
    stubs.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=sid))
    stubs.sessions.ResumeSession(session_pb2.ResumeSessionRequest(session_id=sid))
    assert _sh(stubs, sid, listing) == before
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)
    data = b"".join(
        r.chunk.data for r in snaps.ExportArchive(snapshot_pb2.ExportArchiveRequest(session_id=sid))
    )
    other = new_session(limits=common_pb2.ResourceLimits(file_bytes=1024 * 1024)).session_id
    try:
        import_tar(stubs, other, data)
    except grpc.RpcError as err:
        assert err.code() in (  # type: ignore[attr-defined]
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ), err.details()  # type: ignore[attr-defined]
        assert _sh(stubs, other, "ls -A /workspace") == b""


def test_a_paused_container_is_busy_not_lost(
    stubs: Stubs, server: ServerProcess, new_session: SessionFactory
) -> None:
    """Paused (as a commit or an operator does) answers every exec with 409: retryable
    UNAVAILABLE, the session stays RUNNING with its files; deleting it does not hang."""
    sid = new_session().session_id
    _sh(stubs, sid, "printf keep > /workspace/k")
    cid = session_container(sid, server.owner_id)
    subprocess.run(["docker", "pause", cid], check=True, capture_output=True)
    try:
        expect_error(lambda: run(stubs, sid, "true"), grpc.StatusCode.UNAVAILABLE)
        got = stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=sid)).session
        assert got.state == session_pb2.SESSION_STATE_RUNNING
    finally:
        subprocess.run(["docker", "unpause", cid], check=True, capture_output=True)
    assert _sh(stubs, sid, "cat /workspace/k") == b"keep"
    subprocess.run(["docker", "pause", cid], check=True, capture_output=True)
    start = time.monotonic()
    stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid), timeout=60)
    assert time.monotonic() - start < 30
    assert subprocess.run(["docker", "inspect", cid], capture_output=True).returncode != 0


def test_reserved_identities_are_refused(stubs: Stubs) -> None:
    for user in ("65533:65533", "65533:1000", "1000:65533"):
        expect_error(
            lambda user=user: stubs.sessions.CreateSession(  # type: ignore[misc]
                session_pb2.CreateSessionRequest(user=user)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_USER",
        )


def test_no_host_path_of_the_server_inside_a_sandbox(
    stubs: Stubs, new_session: SessionFactory, server: ServerProcess
) -> None:
    """The helper comes from a volume named after its content, not bound from the server's
    checkout: nothing in mountinfo or the environment names where the server lives."""
    sid = new_session().session_id
    seen = _sh(stubs, sid, "cat /proc/self/mountinfo; tr '\\0' '\\n' < /proc/self/environ")
    repo = Path(__file__).resolve().parents[2]
    # The checkout (where the helper is built) and the server's data directory: a sandbox
    # names neither. (Not their parents: a checkout under /tmp has /tmp, which every
    # sandbox has as its own tmpfs.)
    for host_path in {str(repo), str(Path.cwd()), str(server.data_dir)}:
        assert host_path.encode() not in seen, seen.decode(errors="replace")
    assert b"/.sandboxd" in seen  # the helper is there (this Run went through it)


def test_import_into_an_unwritable_folder_is_refused_whole(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    """The merge looks before it moves: a 555 folder in the way refuses the import before
    `a` (merged first) has landed."""
    sid = new_session().session_id
    _sh(stubs, sid, "cd /workspace && mkdir ro && printf k > ro/k && chmod 555 ro")
    before = _sh(stubs, sid, TREE_SCRIPT)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("a", "ro/x"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(grpc.RpcError) as err:
        import_tar(stubs, sid, buf.getvalue())
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()  # type: ignore[attr-defined]
    assert _sh(stubs, sid, TREE_SCRIPT) == before
