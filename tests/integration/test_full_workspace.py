"""Every change to a workspace is all or nothing, with the workspace filled to the last byte.

Each test gives its session a 4 MiB workspace (the file cap as large), fills it with the file
`fill` until not one page is free (or leaves exactly what a test needs), and then makes the
change. A refused change leaves the tree exactly as it was, entry by entry (the fuzzer's tree:
type, mode, size, content hash, link target); where the new content is staged beside the old
(a write's temporary file, an import's staging folder), a workspace without room for both
refuses before the old content is touched. Renames need no room: a Move or a Remove works in a
full workspace.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import pytest
from conftest import SessionFactory, Stubs, error_info, expect_error
from sandboxd.v1 import (
    common_pb2,
    filesystem_pb2,
    session_pb2,
    snapshot_pb2,
)
from test_archive import dir_, import_tar, make_tar, member, snap_stub
from test_fuzz_workspace import sh, tree

MiB = 1024 * 1024
WS = 4 * MiB
PAGE = 4096
RE = grpc.StatusCode.RESOURCE_EXHAUSTED
E = filesystem_pb2


def free_bytes(stubs: Stubs, sid: str) -> int:
    """What the sandbox user may still write (tmpfs counts whole pages)."""
    r = sh(stubs, sid, "stat -f -c '%a %S' /workspace")
    blocks, size = r.stdout.split()
    return int(blocks) * int(size)


def fill(stubs: Stubs, sid: str, leave: int = 0) -> None:
    """Fill the workspace with `fill` until exactly `leave` bytes (whole pages) are free."""
    free = free_bytes(stubs, sid) - leave
    assert free >= 0 and free % PAGE == 0, free
    r = sh(stubs, sid, f"head -c {free} /dev/zero > /workspace/fill")
    assert r.exit_code == 0, r.stderr
    assert free_bytes(stubs, sid) == leave


@pytest.fixture
def small(new_session: SessionFactory) -> str:
    limits = common_pb2.ResourceLimits(workspace_bytes=WS, file_bytes=WS)
    return new_session(limits=limits).session_id


def _old_folder(stubs: Stubs, sid: str) -> None:
    r = sh(
        stubs,
        sid,
        "cd /workspace && mkdir -p d/sub && head -c 1048576 /dev/urandom > d/old "
        "&& printf small > d/sub/s && ln -s old d/link && chmod 555 d/sub",
    )
    assert r.exit_code == 0, r.stderr


def test_replace_import_refused_for_room_keeps_the_old_folder(stubs: Stubs, small: str) -> None:
    """The case found outside: a replace into `d` of an archive that fits neither beside d's
    old content nor in place of it left `d` empty; now it is refused with `d` untouched."""
    _old_folder(stubs, small)
    fill(stubs, small)
    before = tree(stubs, small)
    data = make_tar(member("new", os.urandom(2 * MiB)), member("more", b"m"))
    expect_error(
        lambda: import_tar(stubs, small, data, path="d", replace=True), RE, "WORKSPACE_FULL"
    )
    assert tree(stubs, small) == before


def test_replace_import_needs_room_for_old_and_new(stubs: Stubs, small: str) -> None:
    """An archive that would fit only once the old content is gone is refused before the old
    content is touched: the new tree is staged beside the old one."""
    r = sh(stubs, small, "head -c 2621440 /dev/urandom > /workspace/old")
    assert r.exit_code == 0
    before = tree(stubs, small)
    data = make_tar(member("new", os.urandom(2 * MiB)))
    expect_error(lambda: import_tar(stubs, small, data, replace=True), RE, "WORKSPACE_FULL")
    assert tree(stubs, small) == before


@pytest.mark.parametrize("replace", [False, True])
def test_import_of_exactly_the_free_space_and_one_byte_more(
    stubs: Stubs, small: str, replace: bool
) -> None:
    _old_folder(stubs, small)
    fill(stubs, small, leave=64 * PAGE)
    before = tree(stubs, small)
    over = make_tar(dir_("n"), member("n/x", os.urandom(64 * PAGE + 1)))
    expect_error(
        lambda: import_tar(stubs, small, over, path="d", replace=replace), RE, "WORKSPACE_FULL"
    )
    assert tree(stubs, small) == before
    exact = make_tar(dir_("n"), member("n/x", os.urandom(64 * PAGE)))
    import_tar(stubs, small, exact, path="d", replace=replace)
    after = tree(stubs, small)
    assert "./d/n/x|regular file|644|262144|" in after
    assert ("./d/old|" in after) is not replace
    assert ".sbx-import-" not in after  # stage and trash are gone


def test_import_refused_for_a_member_keeps_a_full_workspace(stubs: Stubs, small: str) -> None:
    _old_folder(stubs, small)
    fill(stubs, small)
    before = tree(stubs, small)
    bad = make_tar(member("d/old", b"new"), member("../escape", b"x"))
    expect_error(
        lambda: import_tar(stubs, small, bad, replace=True), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert tree(stubs, small) == before
    big = make_tar(member("ok", b"k"), member("huge", b"h" * (WS + 1)))
    expect_error(lambda: import_tar(stubs, small, big), RE)
    assert tree(stubs, small) == before


def test_write_over_a_file_in_a_full_workspace_keeps_the_old_file(stubs: Stubs, small: str) -> None:
    _old_folder(stubs, small)
    fill(stubs, small)
    before = tree(stubs, small)
    req = filesystem_pb2.WriteFileRequest(session_id=small, path="d/old", content=b"n" * PAGE)
    expect_error(lambda: stubs.files.WriteFile(req), RE, "WORKSPACE_FULL")
    assert tree(stubs, small) == before


def test_write_of_exactly_the_free_space_and_one_byte_more(stubs: Stubs, small: str) -> None:
    fill(stubs, small, leave=16 * PAGE)
    before = tree(stubs, small)
    over = filesystem_pb2.WriteFileRequest(
        session_id=small, path="w", content=b"o" * (16 * PAGE + 1)
    )
    expect_error(lambda: stubs.files.WriteFile(over), RE, "WORKSPACE_FULL")
    assert tree(stubs, small) == before
    exact = filesystem_pb2.WriteFileRequest(session_id=small, path="w", content=b"e" * 16 * PAGE)
    assert stubs.files.WriteFile(exact).info.size == 16 * PAGE
    assert free_bytes(stubs, small) == 0


def _stream(sid: str, path: str, chunks: list[bytes]) -> Iterator[E.WriteFileStreamRequest]:
    yield E.WriteFileStreamRequest(header=E.WriteFileStreamHeader(session_id=sid, path=path))
    for chunk in chunks:
        yield E.WriteFileStreamRequest(data=chunk)


def test_streamed_write_over_a_file_in_a_full_workspace_keeps_it(stubs: Stubs, small: str) -> None:
    _old_folder(stubs, small)
    fill(stubs, small, leave=8 * PAGE)
    before = tree(stubs, small)
    chunks = [b"s" * (4 * PAGE)] * 3  # one page more than is free
    expect_error(
        lambda: stubs.files.WriteFileStream(_stream(small, "d/old", chunks), timeout=60),
        RE,
        "WORKSPACE_FULL",
    )
    assert tree(stubs, small) == before


def test_move_and_remove_work_in_a_full_workspace(stubs: Stubs, small: str) -> None:
    _old_folder(stubs, small)
    sh(stubs, small, "cd /workspace && mkdir -p e/full && printf x > e/full/x && printf y > e/y")
    fill(stubs, small)
    before = tree(stubs, small)
    refused = E.MoveRequest(
        session_id=small, source_path="d", destination_path="e/full", overwrite=True
    )
    expect_error(lambda: stubs.files.Move(refused), grpc.StatusCode.FAILED_PRECONDITION)
    expect_error(
        lambda: stubs.files.Remove(filesystem_pb2.RemoveRequest(session_id=small, path="d")),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert tree(stubs, small) == before
    across = E.MoveRequest(
        session_id=small, source_path="d/old", destination_path="e/y", overwrite=True
    )
    stubs.files.Move(across)
    stubs.files.Remove(filesystem_pb2.RemoveRequest(session_id=small, path="d", recursive=True))
    after = tree(stubs, small)
    assert "./d|" not in after and ".sbx-import-" not in after
    assert after.count("./e/y|regular file|644|1048576|") == 1


def test_suspend_resume_and_fork_of_a_full_workspace(
    stubs: Stubs, small: str, new_session: SessionFactory
) -> None:
    _old_folder(stubs, small)
    fill(stubs, small)
    before = tree(stubs, small)
    stubs.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=small))
    stubs.sessions.ResumeSession(session_pb2.ResumeSessionRequest(session_id=small))
    assert tree(stubs, small) == before
    snap = snap_stub(stubs).CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(session_id=small))
    snap_id = snap.snapshot.snapshot_id
    same = new_session(
        from_snapshot_id=snap_id,
        limits=common_pb2.ResourceLimits(workspace_bytes=WS, file_bytes=WS),
    )
    assert tree(stubs, same.session_id) == before
    # Into a smaller workspace: refused, no session left, the source as it was.
    listed = stubs.sessions.ListSessions(session_pb2.ListSessionsRequest()).sessions
    err = expect_error(
        lambda: new_session(
            from_snapshot_id=snap_id,
            limits=common_pb2.ResourceLimits(workspace_bytes=2 * MiB, file_bytes=MiB),
        ),
        RE,
    )
    assert error_info(err).reason in ("WORKSPACE_FULL", "FILE_TOO_LARGE", "ARCHIVE_TOO_LARGE")
    again = stubs.sessions.ListSessions(session_pb2.ListSessionsRequest()).sessions
    assert {s.session_id for s in again} <= {s.session_id for s in listed}
    assert tree(stubs, small) == before
