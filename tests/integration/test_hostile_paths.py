"""Hostile input, paths (SECURITY.md "Files and archives"): every escape fails with its reason.

Each case also passes the `guard`: the server stays healthy and the bystander session is intact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
import pytest
from conftest import Stubs, expect_error, run
from sandboxd.v1 import filesystem_pb2

F = filesystem_pb2
pytestmark = pytest.mark.usefixtures("guard")
INVALID = grpc.StatusCode.INVALID_ARGUMENT
OUTSIDE = "PATH_OUTSIDE_WORKSPACE"

LEXICAL = [
    ("../etc/passwd", OUTSIDE),
    ("..", OUTSIDE),
    ("./../x", OUTSIDE),
    ("/etc/shadow", OUTSIDE),
    ("/", OUTSIDE),
    ("//etc/passwd", OUTSIDE),
    ("/./etc/passwd", OUTSIDE),
    ("/workspace/../etc/passwd", OUTSIDE),
    ("/workspace/a/../../etc", OUTSIDE),
    ("a/b/../../../x", OUTSIDE),
    ("/workspacex/a", OUTSIDE),
    ("/proc/self/root/etc/passwd", OUTSIDE),
    ("/tmp/x", OUTSIDE),
    ("a/..", OUTSIDE),
    ("\x00", "PATH_INVALID"),
    ("ok\x00/../../etc/passwd", "PATH_INVALID"),
    ("a" * 4097, "PATH_INVALID"),
    ("d/" + "x" * 256, "PATH_INVALID"),
    ("é" * 2049, "PATH_INVALID"),  # 4098 bytes in UTF-8, fewer characters than the limit
]


def _file_calls(s: Stubs, sid: str, path: str) -> dict[str, Callable[[], object]]:
    return {
        "ReadFile": lambda: s.files.ReadFile(F.ReadFileRequest(session_id=sid, path=path)),
        "WriteFile": lambda: s.files.WriteFile(
            F.WriteFileRequest(session_id=sid, path=path, content=b"x", make_parents=True)
        ),
        "Stat": lambda: s.files.Stat(F.StatRequest(session_id=sid, path=path)),
        "ListDir": lambda: s.files.ListDir(F.ListDirRequest(session_id=sid, path=path)),
        "Remove": lambda: s.files.Remove(
            F.RemoveRequest(session_id=sid, path=path, recursive=True)
        ),
        "MakeDir": lambda: s.files.MakeDir(
            F.MakeDirRequest(session_id=sid, path=path, parents=True)
        ),
    }


@pytest.mark.parametrize(("path", "reason"), LEXICAL, ids=[repr(p)[:30] for p, _ in LEXICAL])
def test_lexical_escape_is_refused_by_every_file_rpc(
    stubs: Stubs, victim: str, path: str, reason: str
) -> None:
    for call in _file_calls(stubs, victim, path).values():
        expect_error(call, INVALID, reason)


@pytest.mark.parametrize(
    ("path", "reason"), LEXICAL[:6], ids=[repr(p)[:30] for p, _ in LEXICAL[:6]]
)
def test_lexical_escape_is_refused_as_cwd(
    stubs: Stubs, victim: str, path: str, reason: str
) -> None:
    expect_error(lambda: run(stubs, victim, "pwd", cwd=path), INVALID, reason)


@pytest.mark.parametrize("path", ["/workspace", ".", "/workspace/.", "./"])
def test_workspace_root_cannot_be_removed(stubs: Stubs, victim: str, path: str) -> None:
    expect_error(
        lambda: stubs.files.Remove(F.RemoveRequest(session_id=victim, path=path, recursive=True)),
        INVALID,
        "PATH_INVALID",
    )


@pytest.fixture(scope="module")
def links(stubs: Stubs, victim: str) -> str:
    """Symlinks planted by the sandbox user, pointing out of the workspace in several ways."""
    script = (
        "ln -s /etc/passwd passwd; ln -s / rootdir; ln -s ../../etc up; ln -s l2 l1; ln -s l1 l2;"
        "mkdir -p d; ln -s /tmp d/t; echo outside > /tmp/target; mkdir -p deep/a;"
        "ln -s ../../../../../../etc deep/a/climb"
    )
    assert run(stubs, victim, "sh", "-c", script).exit_code == 0
    return victim


SYMLINK_ESCAPES = [
    ("ReadFile", "passwd"),
    ("ReadFile", "rootdir/etc/passwd"),
    ("ReadFile", "up/passwd"),
    ("ReadFile", "deep/a/climb/passwd"),
    ("ReadFile", "l1"),
    ("Stat", "l1/x"),
    ("Stat", "rootdir/etc"),
    ("ListDir", "rootdir"),
    ("ListDir", "up"),
    ("WriteFile", "d/t/planted"),
    ("WriteFile", "rootdir/tmp/planted"),
    ("MakeDir", "d/t/newdir"),
    ("Remove", "d/t/target"),
    ("Remove", "rootdir/tmp/target"),
]


@pytest.mark.parametrize(
    ("rpc", "path"), SYMLINK_ESCAPES, ids=[f"{r}:{p}" for r, p in SYMLINK_ESCAPES]
)
def test_symlink_escape_is_refused(stubs: Stubs, links: str, rpc: str, path: str) -> None:
    expect_error(_file_calls(stubs, links, path)[rpc], INVALID, OUTSIDE)
    # nothing was planted or removed outside
    listing = run(stubs, links, "ls", "/tmp").stdout
    assert listing == b"target\n"


def test_cwd_through_a_symlink_out_is_refused(stubs: Stubs, links: str) -> None:
    # the helper refuses to chdir out of the workspace; the command never starts
    result = run(stubs, links, "pwd", cwd="rootdir/etc")
    assert result.exit_code == 126 and result.stdout == b""
    assert b"ESCAPE" in result.stderr


def test_symlink_swap_race_never_reads_outside(stubs: Stubs, victim: str) -> None:
    """A command flips a link between an inside dir and /etc while the API reads through it."""
    run(stubs, victim, "sh", "-c", "mkdir -p race-in && echo inside > race-in/passwd")
    flipper = threading.Thread(
        target=lambda: run(
            stubs,
            victim,
            "sh",
            "-c",
            "end=$(($(date +%s)+4)); while [ $(date +%s) -lt $end ]; do "
            "ln -sfn /etc race; ln -sfn race-in race; done",
        )
    )
    flipper.start()
    seen: set[bytes] = set()
    try:
        for _ in range(60):
            try:
                got = stubs.files.ReadFile(F.ReadFileRequest(session_id=victim, path="race/passwd"))
                seen.add(got.content)
            except grpc.RpcError as err:
                assert err.code() in (INVALID, grpc.StatusCode.NOT_FOUND), err.details()  # type: ignore[attr-defined]
    finally:
        flipper.join(30)
    assert all(b"root:" not in content for content in seen), seen


def test_fifo_is_not_read_and_does_not_hang(stubs: Stubs, victim: str) -> None:
    run(stubs, victim, "mkfifo", "pipe")
    expect_error(
        lambda: stubs.files.ReadFile(F.ReadFileRequest(session_id=victim, path="pipe"), timeout=20),
        INVALID,
        "PATH_INVALID",
    )


def test_sparse_giant_file_is_too_large_to_read(stubs: Stubs, victim: str) -> None:
    run(stubs, victim, "truncate", "-s", "1G", "sparse")
    expect_error(
        lambda: stubs.files.ReadFile(F.ReadFileRequest(session_id=victim, path="sparse")),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "FILE_TOO_LARGE",
    )
    run(stubs, victim, "rm", "sparse")


def test_setuid_bits_are_stripped_on_write(stubs: Stubs, victim: str) -> None:
    info = stubs.files.WriteFile(
        F.WriteFileRequest(session_id=victim, path="suid", content=b"x", mode=0o6755)
    ).info
    assert info.mode & 0o7777 == 0o755


def test_file_mode_out_of_range_is_refused(stubs: Stubs, victim: str) -> None:
    expect_error(
        lambda: stubs.files.WriteFile(
            F.WriteFileRequest(session_id=victim, path="m", content=b"x", mode=0o17777)
        ),
        INVALID,
        "INVALID_MODE",
    )


def test_listing_depth_is_bounded(stubs: Stubs, victim: str) -> None:
    expect_error(
        lambda: stubs.files.ListDir(F.ListDirRequest(session_id=victim, depth=1_000_000)),
        INVALID,
        "INVALID_DEPTH",
    )


def test_device_nodes_and_cross_device_links_cannot_be_made(
    stubs: Stubs, victim: str, tier: str
) -> None:
    if tier == "gvisor":
        # gVisor's own kernel lets mknod through (Debian 12's runsc, measured) but every device
        # is emulated in its Sentry: no host device is reachable (1:1 is /dev/mem on a host).
        run(stubs, victim, "mknod", "mem", "c", "1", "1")
        assert run(stubs, victim, "head", "-c", "1", "mem").exit_code != 0
        run(stubs, victim, "rm", "-f", "mem")
    else:
        assert run(stubs, victim, "mknod", "null2", "c", "1", "3").exit_code != 0
    assert run(stubs, victim, "ln", "/etc/passwd", "hard").exit_code != 0
    expect_error(
        lambda: stubs.files.Stat(F.StatRequest(session_id=victim, path="hard")),
        grpc.StatusCode.NOT_FOUND,
        "FILE_NOT_FOUND",
    )
