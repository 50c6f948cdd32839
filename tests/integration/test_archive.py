"""Tar export and import against a real server: round trips, and every archive SECURITY.md
refuses, each with its ErrorInfo reason and the workspace left exactly as it was."""

from __future__ import annotations

import io
import secrets
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import (
    ServerProcess,
    SessionFactory,
    Stubs,
    expect_error,
    make_stubs,
    own_server,
    rss_bytes,
    run,
    wait_until,
)
from sandboxd.v1 import common_pb2, snapshot_pb2, snapshot_pb2_grpc

IA = grpc.StatusCode.INVALID_ARGUMENT
RE = grpc.StatusCode.RESOURCE_EXHAUSTED

Member = tuple[tarfile.TarInfo, bytes | None]


def member(name: str, data: bytes | None = b"x", **attrs: object) -> Member:
    info = tarfile.TarInfo(name)
    info.mode = 0o644
    info.mtime = 1_700_000_000
    if data is not None:
        info.size = len(data)
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, data


def make_tar(*members: Member) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def dir_(name: str) -> Member:
    return member(name, None, type=tarfile.DIRTYPE, mode=0o755)


def symlink(name: str, target: str) -> Member:
    return member(name, None, type=tarfile.SYMTYPE, linkname=target)


def hardlink(name: str, target: str) -> Member:
    return member(name, None, type=tarfile.LNKTYPE, linkname=target)


def snap_stub(stubs: Stubs) -> snapshot_pb2_grpc.SnapshotServiceStub:
    return snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)


def import_tar(
    stubs: Stubs,
    session_id: str,
    data: bytes,
    *,
    path: str = "",
    replace: bool = False,
    chunk: int = 64 * 1024,
) -> snapshot_pb2.ImportArchiveResponse:
    def requests() -> Iterator[snapshot_pb2.ImportArchiveRequest]:
        yield snapshot_pb2.ImportArchiveRequest(
            header=snapshot_pb2.ImportArchiveHeader(
                session_id=session_id, path=path, replace=replace
            )
        )
        for i in range(0, len(data), chunk):
            yield snapshot_pb2.ImportArchiveRequest(data=data[i : i + chunk])

    return snap_stub(stubs).ImportArchive(requests())  # type: ignore[no-any-return]


def export_tar(stubs: Stubs, session_id: str, path: str = "") -> bytes:
    replies = snap_stub(stubs).ExportArchive(
        snapshot_pb2.ExportArchiveRequest(session_id=session_id, path=path)
    )
    return b"".join(r.chunk.data for r in replies)


def tree(stubs: Stubs, session_id: str) -> str:
    """Every path under /workspace with type, mode and content hash: 'unchanged' means equal."""
    script = (
        "cd /workspace && find . | sort | while read -r p; do "
        'printf "%s %s " "$p" "$(stat -c %A "$p")"; '
        'if [ -L "$p" ]; then readlink "$p"; elif [ -f "$p" ]; then md5sum < "$p"; '
        "else echo; fi; done"
    )
    r = run(stubs, session_id, "sh", "-c", script)
    assert r.exit_code == 0, r.stderr
    return r.stdout.decode()


@pytest.fixture
def sid(new_session: SessionFactory, stubs: Stubs) -> str:
    s = new_session()
    import_tar(stubs, s.session_id, make_tar(dir_("keep"), member("keep/old.txt", b"old\n")))
    return s.session_id


# ----- round trips --------------------------------------------------------------------------


def test_import_then_export_round_trip(stubs: Stubs, sid: str) -> None:
    data = make_tar(
        dir_("src"),
        member("src/main.py", b"print('hi')\n", mode=0o755),
        member("README", b"readme\n"),
        symlink("src/link", "main.py"),
        hardlink("copy", "README"),
    )
    reply = import_tar(stubs, sid, data)
    assert reply.files == 5
    assert reply.bytes == len(b"print('hi')\n") + len(b"readme\n")
    with tarfile.open(fileobj=io.BytesIO(export_tar(stubs, sid))) as tar:
        names = {m.name.removeprefix("./"): m for m in tar.getmembers()}
        assert tar.extractfile(names["src/main.py"]).read() == b"print('hi')\n"  # type: ignore[union-attr]
        assert names["src/main.py"].mode & 0o777 == 0o755
        assert names["src/link"].issym() and names["src/link"].linkname == "main.py"
        assert "keep/old.txt" in names  # merged, not replaced
    assert run(stubs, sid, "cat", "copy").stdout == b"readme\n"


def test_import_replace_empties_the_destination(stubs: Stubs, sid: str) -> None:
    import_tar(stubs, sid, make_tar(member("new.txt", b"new")), replace=True)
    assert run(stubs, sid, "ls", "-A", "/workspace").stdout.split() == [b"new.txt"]


def test_import_into_a_subfolder_and_export_it(stubs: Stubs, sid: str) -> None:
    import_tar(stubs, sid, make_tar(member("a.txt", b"A")), path="deep/er")
    assert run(stubs, sid, "cat", "deep/er/a.txt").stdout == b"A"
    with tarfile.open(fileobj=io.BytesIO(export_tar(stubs, sid, "deep"))) as tar:
        assert "./er/a.txt" in tar.getnames()


def test_import_merge_replaces_a_file_and_keeps_others(stubs: Stubs, sid: str) -> None:
    import_tar(stubs, sid, make_tar(member("keep/old.txt", b"newer\n"), member("keep/2", b"2")))
    assert run(stubs, sid, "cat", "keep/old.txt").stdout == b"newer\n"
    assert run(stubs, sid, "cat", "keep/2").stdout == b"2"


def test_setuid_and_setgid_bits_are_stripped(stubs: Stubs, sid: str) -> None:
    import_tar(stubs, sid, make_tar(member("suid", b"#!/bin/sh\n", mode=0o6755)))
    assert run(stubs, sid, "stat", "-c", "%a", "suid").stdout.strip() == b"755"


def test_export_does_not_follow_symlinks_out(stubs: Stubs, sid: str) -> None:
    assert run(stubs, sid, "ln", "-s", "/etc", "etc-link").exit_code == 0
    with tarfile.open(fileobj=io.BytesIO(export_tar(stubs, sid))) as tar:
        link = tar.getmember("./etc-link")
        assert link.issym() and link.linkname == "/etc"
        assert not any(n.startswith("./etc-link/") for n in tar.getnames())
    expect_error(lambda: export_tar(stubs, sid, "etc-link"), IA, "PATH_OUTSIDE_WORKSPACE")


def test_export_path_outside_is_refused(stubs: Stubs, sid: str) -> None:
    expect_error(lambda: export_tar(stubs, sid, "../etc"), IA, "PATH_OUTSIDE_WORKSPACE")
    expect_error(
        lambda: export_tar(stubs, sid, "missing"), grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND"
    )


# ----- refusals: each leaves the workspace unchanged ----------------------------------------


def _good_then(*bad: Member) -> bytes:
    """A few good members first, so a refusal has something it must not let land."""
    return make_tar(dir_("fresh"), member("fresh/ok.txt", b"ok"), *bad)


BAD_ARCHIVES: dict[str, tuple[bytes, grpc.StatusCode, str]] = {
    "dotdot": (_good_then(member("../evil", b"x")), IA, "ARCHIVE_PATH_TRAVERSAL"),
    "dotdot-inside": (_good_then(member("a/../../evil", b"x")), IA, "ARCHIVE_PATH_TRAVERSAL"),
    "absolute": (_good_then(member("/tmp/evil", b"x")), IA, "ARCHIVE_ABSOLUTE_PATH"),
    "symlink-absolute": (_good_then(symlink("out", "/etc")), IA, "ARCHIVE_LINK_OUTSIDE"),
    "symlink-up": (_good_then(symlink("fresh/out", "../../x")), IA, "ARCHIVE_LINK_OUTSIDE"),
    "through-own-symlink": (
        _good_then(symlink("in", "fresh"), member("in/x", b"x")),
        IA,
        "ARCHIVE_THROUGH_SYMLINK",
    ),
    "hardlink-out": (_good_then(hardlink("h", "../../etc/passwd")), IA, "ARCHIVE_LINK_OUTSIDE"),
    "hardlink-absolute": (_good_then(hardlink("h", "/etc/passwd")), IA, "ARCHIVE_LINK_OUTSIDE"),
    "hardlink-to-nothing": (_good_then(hardlink("h", "nope")), IA, "ARCHIVE_LINK_OUTSIDE"),
    "char-device": (
        _good_then(member("dev", None, type=tarfile.CHRTYPE, devmajor=1, devminor=3)),
        IA,
        "ARCHIVE_SPECIAL_FILE",
    ),
    "block-device": (
        _good_then(member("blk", None, type=tarfile.BLKTYPE, devmajor=7, devminor=0)),
        IA,
        "ARCHIVE_SPECIAL_FILE",
    ),
    "fifo": (_good_then(member("fifo", None, type=tarfile.FIFOTYPE)), IA, "ARCHIVE_SPECIAL_FILE"),
    "duplicate": (
        _good_then(member("fresh/ok.txt", b"again")),
        IA,
        "ARCHIVE_DUPLICATE_MEMBER",
    ),
    "random-bytes": (secrets.token_bytes(8192), IA, "ARCHIVE_INVALID"),
    "empty": (b"", IA, "ARCHIVE_INVALID"),
}


def _truncated_mid_member() -> bytes:
    data = _good_then(member("big", b"y" * 20000))
    return data[: 512 * 6 + 5000]


def _no_end_marker() -> bytes:
    data = make_tar(member("a", b"a" * 512))
    return data[: 512 * 2]  # header and data, then nothing


def _size_lies_bigger() -> bytes:
    info, _ = member("liar", b"")
    info.size = 100_000
    raw = info.tobuf(tarfile.PAX_FORMAT) + b"short" + b"\0" * 507
    return make_tar(dir_("fresh"), member("fresh/ok.txt", b"ok"))[:-10240] + raw + b"\0" * 1024


def _size_lies_smaller() -> bytes:
    info, _ = member("liar", b"")
    info.size = 10
    body = b"z" * 4096  # really 4 KiB: the rest is read as headers
    return info.tobuf(tarfile.PAX_FORMAT) + body + b"\0" * 1024


BAD_ARCHIVES |= {
    "truncated-mid-member": (_truncated_mid_member(), IA, "ARCHIVE_TRUNCATED"),
    "no-end-marker": (_no_end_marker(), IA, "ARCHIVE_TRUNCATED"),
    "size-lies-bigger": (_size_lies_bigger(), IA, "ARCHIVE_TRUNCATED"),
    "size-lies-smaller": (_size_lies_smaller(), IA, "ARCHIVE_INVALID"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARCHIVES))
def test_bad_archive_is_refused_and_changes_nothing(stubs: Stubs, sid: str, case: str) -> None:
    data, code, reason = BAD_ARCHIVES[case]
    before = tree(stubs, sid)
    expect_error(lambda: import_tar(stubs, sid, data, chunk=3000), code, reason)
    assert tree(stubs, sid) == before
    expect_error(lambda: import_tar(stubs, sid, data, replace=True), code, reason)
    assert tree(stubs, sid) == before


def test_member_through_an_existing_symlink_pointing_out(stubs: Stubs, sid: str) -> None:
    assert run(stubs, sid, "ln", "-s", "/tmp", "out").exit_code == 0
    before = tree(stubs, sid)
    marker = "x" + secrets.token_hex(4)
    data = _good_then(member(f"out/{marker}", b"escaped"))
    expect_error(lambda: import_tar(stubs, sid, data), IA, "ARCHIVE_THROUGH_SYMLINK")
    assert tree(stubs, sid) == before
    assert run(stubs, sid, "ls", f"/tmp/{marker}").exit_code != 0


def test_member_replacing_an_existing_symlink_replaces_the_link(stubs: Stubs, sid: str) -> None:
    assert run(stubs, sid, "ln", "-s", "/tmp/target-" + secrets.token_hex(4), "f").exit_code == 0
    import_tar(stubs, sid, make_tar(member("f", b"plain")))
    assert run(stubs, sid, "cat", "f").stdout == b"plain"
    assert run(stubs, sid, "sh", "-c", "test -L f").exit_code == 1


def test_member_over_the_file_cap(stubs: Stubs, new_session: SessionFactory) -> None:
    s = new_session(limits=common_pb2.ResourceLimits(file_bytes=4096))
    before = tree(stubs, s.session_id)
    data = _good_then(member("big", b"b" * 5000))
    expect_error(lambda: import_tar(stubs, s.session_id, data), RE, "FILE_TOO_LARGE")
    assert tree(stubs, s.session_id) == before


def test_archive_over_the_workspace_cap(stubs: Stubs, new_session: SessionFactory) -> None:
    cap = 1024 * 1024
    s = new_session(limits=common_pb2.ResourceLimits(workspace_bytes=cap, file_bytes=cap))
    before = tree(stubs, s.session_id)
    data = make_tar(member("a", b"a" * 700_000), member("b", b"b" * 700_000))
    expect_error(lambda: import_tar(stubs, s.session_id, data), RE, "WORKSPACE_FULL")
    assert tree(stubs, s.session_id) == before


def test_archive_that_does_not_fit_beside_existing_files(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    cap = 1024 * 1024
    s = new_session(limits=common_pb2.ResourceLimits(workspace_bytes=cap, file_bytes=cap))
    import_tar(stubs, s.session_id, make_tar(member("first", b"1" * 600_000)))
    before = tree(stubs, s.session_id)
    data = make_tar(member("second", b"2" * 600_000))
    expect_error(lambda: import_tar(stubs, s.session_id, data), RE, "WORKSPACE_FULL")
    assert tree(stubs, s.session_id) == before


def test_replace_that_fits_only_without_the_old_content(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    """The new tree is staged beside the old one: without room for both, the replace is
    refused before the old content is touched (tests/integration/test_full_workspace.py)."""
    cap = 1024 * 1024
    s = new_session(limits=common_pb2.ResourceLimits(workspace_bytes=cap, file_bytes=cap))
    import_tar(stubs, s.session_id, make_tar(member("first", b"1" * 600_000)))
    before = tree(stubs, s.session_id)
    data = make_tar(member("second", b"2" * 600_000))
    expect_error(lambda: import_tar(stubs, s.session_id, data, replace=True), RE, "WORKSPACE_FULL")
    assert tree(stubs, s.session_id) == before


def test_header_must_come_first_and_only_once(stubs: Stubs, sid: str) -> None:
    stub = snap_stub(stubs)
    expect_error(
        lambda: stub.ImportArchive(iter([snapshot_pb2.ImportArchiveRequest(data=b"x")])),
        IA,
        "ARCHIVE_HEADER_INVALID",
    )
    header = snapshot_pb2.ImportArchiveRequest(
        header=snapshot_pb2.ImportArchiveHeader(session_id=sid)
    )
    expect_error(lambda: stub.ImportArchive(iter([header, header])), IA, "ARCHIVE_HEADER_INVALID")


def test_import_path_outside_is_refused(stubs: Stubs, sid: str) -> None:
    data = make_tar(member("a", b"a"))
    expect_error(lambda: import_tar(stubs, sid, data, path="../x"), IA, "PATH_OUTSIDE_WORKSPACE")
    assert run(stubs, sid, "ln", "-s", "/tmp", "tmpl").exit_code == 0
    expect_error(lambda: import_tar(stubs, sid, data, path="tmpl"), IA, "PATH_OUTSIDE_WORKSPACE")


def test_unknown_session(stubs: Stubs) -> None:
    expect_error(
        lambda: export_tar(stubs, "no-such-session"),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    )
    expect_error(
        lambda: import_tar(stubs, "no-such-session", make_tar(member("a"))),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    )


# ----- the member-count cap needs a server configured with a small one ----------------------


@pytest.fixture(scope="module")
def small_cap_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    owner = "testarc" + secrets.token_hex(3)
    data_dir: Path = tmp_path_factory.mktemp("arc")
    with own_server(data_dir, owner, "--archive-max-members", "10") as srv:
        yield srv


def test_more_members_than_the_cap(small_cap_server: ServerProcess) -> None:
    stubs = make_stubs(small_cap_server.address)
    try:
        from sandboxd.v1 import session_pb2

        s = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
        ).session
        before = tree(stubs, s.session_id)
        ok = make_tar(*(member(f"f{i}", b"x") for i in range(9)))
        assert import_tar(stubs, s.session_id, ok).files == 9
        before = tree(stubs, s.session_id)
        data = make_tar(*(member(f"g{i}", b"x") for i in range(11)))
        expect_error(lambda: import_tar(stubs, s.session_id, data), IA, "ARCHIVE_TOO_MANY_MEMBERS")
        assert tree(stubs, s.session_id) == before
    finally:
        stubs.channel.close()


def test_a_cancelled_import_changes_nothing(stubs: Stubs, sid: str) -> None:
    before = tree(stubs, sid)
    started = threading.Event()

    def requests() -> Iterator[snapshot_pb2.ImportArchiveRequest]:
        yield snapshot_pb2.ImportArchiveRequest(
            header=snapshot_pb2.ImportArchiveHeader(session_id=sid)
        )
        yield snapshot_pb2.ImportArchiveRequest(data=_good_then(member("late", b"l"))[:4096])
        started.set()
        time.sleep(30)  # the client goes quiet, then goes away

    call = snap_stub(stubs).ImportArchive.future(requests())
    assert started.wait(10)
    time.sleep(1)
    call.cancel()
    assert wait_until(lambda: tree(stubs, sid) == before, timeout=10), tree(stubs, sid)


def test_hundreds_of_long_deep_names_keep_the_server_small(
    server: ServerProcess, stubs: Stubs, sid: str
) -> None:
    """400 files, each 60 folders deep under a first folder of its own (names of ~3 000
    characters, no folder shared): importing them, then exporting them, grows the server by
    less than 64 MiB (an import of 400 such members once grew it by 179 MiB)."""
    deep = "/".join(secrets.token_hex(24) for _ in range(60))
    data = make_tar(*(member(f"{i:03d}/{deep}/f", b"x") for i in range(400)))
    peak = [rss_bytes(server.proc.pid)]
    base = peak[0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], rss_bytes(server.proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        import_tar(stubs, sid, data)
        exported = export_tar(stubs, sid)
    finally:
        stop.set()
        sampler.join()
    grew = max(peak[0], rss_bytes(server.proc.pid)) - base
    assert grew < 64 * 1024 * 1024, f"the server grew by {grew >> 20} MiB"
    with tarfile.open(fileobj=io.BytesIO(exported)) as tar:
        files = [m.name for m in tar.getmembers() if m.isfile() and m.name.endswith(f"{deep}/f")]
    assert len(files) == 400
