"""FilesystemService against the real engine: confinement, symlinks, caps."""

from __future__ import annotations

import grpc
import pytest
from conftest import SessionFactory, Stubs, expect_error, run
from sandboxd.v1 import common_pb2, filesystem_pb2, session_pb2

F = filesystem_pb2


def test_write_read_stat_list_remove(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    sid = shared_session.session_id
    info = stubs.files.WriteFile(
        F.WriteFileRequest(session_id=sid, path="proj/a.txt", content=b"alpha", make_parents=True)
    ).info
    assert (info.path, info.name, info.type, info.size, info.mode) == (
        "proj/a.txt",
        "a.txt",
        F.FILE_TYPE_FILE,
        5,
        0o644,
    )
    assert info.modified_at.seconds > 0
    got = stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path="/workspace/proj/a.txt"))
    assert (got.content, got.size, got.mode) == (b"alpha", 5, 0o644)
    stubs.files.WriteFile(
        F.WriteFileRequest(session_id=sid, path="proj/run.sh", content=b"#!/bin/sh\n", mode=0o755)
    )
    assert stubs.files.Stat(F.StatRequest(session_id=sid, path="proj/run.sh")).info.mode == 0o755
    d = stubs.files.MakeDir(F.MakeDirRequest(session_id=sid, path="proj/sub/deep", parents=True))
    assert d.info.type == F.FILE_TYPE_DIRECTORY
    flat = stubs.files.ListDir(F.ListDirRequest(session_id=sid, path="proj")).entries
    assert sorted(e.path for e in flat) == ["proj/a.txt", "proj/run.sh", "proj/sub"]
    deep = stubs.files.ListDir(F.ListDirRequest(session_id=sid, path="proj", depth=3)).entries
    assert "proj/sub/deep" in {e.path for e in deep}
    root = stubs.files.Stat(F.StatRequest(session_id=sid, path="")).info
    assert root.type == F.FILE_TYPE_DIRECTORY and root.path == "."
    # the command sees what the API wrote
    assert run(stubs, sid, "cat", "proj/a.txt").stdout == b"alpha"

    expect_error(
        lambda: stubs.files.Remove(F.RemoveRequest(session_id=sid, path="proj")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "DIRECTORY_NOT_EMPTY",
    )
    stubs.files.Remove(F.RemoveRequest(session_id=sid, path="proj", recursive=True))
    expect_error(
        lambda: stubs.files.Stat(F.StatRequest(session_id=sid, path="proj")),
        grpc.StatusCode.NOT_FOUND,
        "FILE_NOT_FOUND",
    )


def test_overwrite_and_errors(stubs: Stubs, shared_session: session_pb2.Session) -> None:
    sid = shared_session.session_id
    stubs.files.WriteFile(F.WriteFileRequest(session_id=sid, path="ow", content=b"one"))
    stubs.files.WriteFile(F.WriteFileRequest(session_id=sid, path="ow", content=b"two"))
    assert stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path="ow")).content == b"two"
    expect_error(
        lambda: stubs.files.WriteFile(
            F.WriteFileRequest(session_id=sid, path="nodir/x", content=b"")
        ),
        grpc.StatusCode.NOT_FOUND,
        "FILE_NOT_FOUND",
    )
    stubs.files.MakeDir(F.MakeDirRequest(session_id=sid, path="adir"))
    expect_error(
        lambda: stubs.files.MakeDir(F.MakeDirRequest(session_id=sid, path="adir")),
        grpc.StatusCode.ALREADY_EXISTS,
        "FILE_EXISTS",
    )
    expect_error(
        lambda: stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path="adir")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "IS_A_DIRECTORY",
    )
    expect_error(
        lambda: stubs.files.ListDir(F.ListDirRequest(session_id=sid, path="ow")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "NOT_A_DIRECTORY",
    )
    expect_error(
        lambda: stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path="missing")),
        grpc.StatusCode.NOT_FOUND,
        "FILE_NOT_FOUND",
    )
    expect_error(
        lambda: stubs.files.ListDir(F.ListDirRequest(session_id=sid, depth=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_DEPTH",
    )
    expect_error(
        lambda: stubs.files.Remove(
            F.RemoveRequest(session_id=sid, path="/workspace", recursive=True)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PATH_INVALID",
    )


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("../etc/passwd", "PATH_OUTSIDE_WORKSPACE"),
        ("a/../../etc/passwd", "PATH_OUTSIDE_WORKSPACE"),
        ("/etc/passwd", "PATH_OUTSIDE_WORKSPACE"),
        ("/workspacex/a", "PATH_OUTSIDE_WORKSPACE"),
        ("a\0b", "PATH_INVALID"),
        ("", "PATH_INVALID"),
        ("a/" * 2049, "PATH_INVALID"),
    ],
)
def test_bad_paths_are_invalid_argument(
    stubs: Stubs, shared_session: session_pb2.Session, path: str, reason: str
) -> None:
    sid = shared_session.session_id
    calls = [
        lambda: stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path=path)),
        lambda: stubs.files.WriteFile(F.WriteFileRequest(session_id=sid, path=path, content=b"x")),
        lambda: stubs.files.Remove(F.RemoveRequest(session_id=sid, path=path)),
        lambda: stubs.files.MakeDir(F.MakeDirRequest(session_id=sid, path=path)),
    ]
    if path:  # an empty path means the workspace itself for Stat and ListDir
        calls += [
            lambda: stubs.files.Stat(F.StatRequest(session_id=sid, path=path)),
            lambda: stubs.files.ListDir(F.ListDirRequest(session_id=sid, path=path)),
        ]
    for call in calls:
        expect_error(call, grpc.StatusCode.INVALID_ARGUMENT, reason)


def test_symlinks_never_lead_out(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    run(stubs, sid, "ln", "-s", "/etc", "etc")
    run(stubs, sid, "ln", "-s", "/etc/passwd", "passwd")
    run(stubs, sid, "ln", "-s", "/tmp", "tmp")
    run(stubs, sid, "ln", "-s", "inside.txt", "ok-link")
    stubs.files.WriteFile(F.WriteFileRequest(session_id=sid, path="inside.txt", content=b"in"))

    # a link inside the workspace is followed; one that leaves it is refused
    assert stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path="ok-link")).content == b"in"
    for path in ("passwd", "etc/passwd"):
        expect_error(
            lambda p=path: stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path=p)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "PATH_OUTSIDE_WORKSPACE",
        )
    expect_error(
        lambda: stubs.files.WriteFile(
            F.WriteFileRequest(session_id=sid, path="tmp/planted", content=b"x")
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PATH_OUTSIDE_WORKSPACE",
    )
    assert run(stubs, sid, "ls", "/tmp").stdout == b"", "a write went through a symlink"
    expect_error(
        lambda: stubs.files.ListDir(F.ListDirRequest(session_id=sid, path="etc")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PATH_OUTSIDE_WORKSPACE",
    )
    expect_error(
        lambda: stubs.files.Stat(F.StatRequest(session_id=sid, path="etc/passwd")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PATH_OUTSIDE_WORKSPACE",
    )
    # the links themselves are reported, not followed
    link = stubs.files.Stat(F.StatRequest(session_id=sid, path="etc")).info
    assert link.type == F.FILE_TYPE_SYMLINK and link.symlink_target == "/etc"
    listing = {
        e.path: e for e in stubs.files.ListDir(F.ListDirRequest(session_id=sid, depth=5)).entries
    }
    assert listing["etc"].type == F.FILE_TYPE_SYMLINK
    assert not any(p.startswith("etc/") for p in listing)
    # writing over a symlink replaces the link, never the target
    stubs.files.WriteFile(F.WriteFileRequest(session_id=sid, path="passwd", content=b"mine"))
    assert stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path="passwd")).content == b"mine"
    assert b"root:" in run(stubs, sid, "cat", "/etc/passwd").stdout
    # removing a link removes the link only
    stubs.files.Remove(F.RemoveRequest(session_id=sid, path="etc"))
    assert b"root:" in run(stubs, sid, "cat", "/etc/passwd").stdout


def test_file_caps(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    mib = 1024 * 1024
    stubs.files.WriteFile(F.WriteFileRequest(session_id=sid, path="max", content=b"m" * mib))
    assert len(stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path="max")).content) == mib
    expect_error(
        lambda: stubs.files.WriteFile(
            F.WriteFileRequest(session_id=sid, path="big", content=b"b" * (mib + 1))
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "FILE_TOO_LARGE",
    )
    run(stubs, sid, "sh", "-c", "head -c 1048577 /dev/zero > big-by-command")
    expect_error(
        lambda: stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path="big-by-command")),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "FILE_TOO_LARGE",
    )


def test_workspace_full(stubs: Stubs, new_session: SessionFactory) -> None:
    mib = 1024 * 1024
    sid = new_session(
        limits=common_pb2.ResourceLimits(workspace_bytes=2 * mib, file_bytes=mib)
    ).session_id
    stubs.files.WriteFile(F.WriteFileRequest(session_id=sid, path="a", content=b"a" * mib))
    stubs.files.WriteFile(F.WriteFileRequest(session_id=sid, path="b", content=b"b" * (mib - 8192)))
    expect_error(
        lambda: stubs.files.WriteFile(
            F.WriteFileRequest(session_id=sid, path="c", content=b"c" * mib)
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "WORKSPACE_FULL",
    )
    # nothing half-written is left behind
    names = {e.path for e in stubs.files.ListDir(F.ListDirRequest(session_id=sid)).entries}
    assert names == {"a", "b"}


def test_unknown_session(stubs: Stubs) -> None:
    expect_error(
        lambda: stubs.files.ReadFile(F.ReadFileRequest(session_id="missing-2", path="a")),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    )
