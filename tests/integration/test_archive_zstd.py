"""Compressed (zstd) export and import against a real server: the compression is done inside
the sandbox, the server relays the frames, and every refusal of a plain import holds for the
same archive compressed, with the workspace left exactly as it was."""

from __future__ import annotations

import io
import secrets
import tarfile
from collections.abc import Iterator

import grpc
import pytest
import zstandard
from conftest import SessionFactory, Stubs, error_info, expect_error, run
from sandboxd.v1 import admin_pb2, admin_pb2_grpc, common_pb2, snapshot_pb2
from test_archive import (
    BAD_ARCHIVES,
    IA,
    RE,
    dir_,
    make_tar,
    member,
    snap_stub,
    symlink,
    tree,
)

ZSTD = snapshot_pb2.ARCHIVE_COMPRESSION_ZSTD
MiB = 1024 * 1024


def zimport(
    stubs: Stubs,
    session_id: str,
    data: bytes,
    *,
    replace: bool = False,
    chunk: int = 16 * 1024,
    compression: int = ZSTD,
) -> snapshot_pb2.ImportArchiveResponse:
    def requests() -> Iterator[snapshot_pb2.ImportArchiveRequest]:
        yield snapshot_pb2.ImportArchiveRequest(
            header=snapshot_pb2.ImportArchiveHeader(
                session_id=session_id, replace=replace, compression=compression
            )
        )
        for i in range(0, len(data), chunk):
            yield snapshot_pb2.ImportArchiveRequest(data=data[i : i + chunk])

    return snap_stub(stubs).ImportArchive(requests())  # type: ignore[no-any-return]


def zexport(stubs: Stubs, session_id: str, path: str = "") -> tuple[bytes, set[int]]:
    replies = snap_stub(stubs).ExportArchive(
        snapshot_pb2.ExportArchiveRequest(session_id=session_id, path=path, compression=ZSTD)
    )
    parts, kinds = [], set()
    for r in replies:
        parts.append(r.chunk.data)
        kinds.add(r.compression)
    return b"".join(parts), kinds


def unzstd(data: bytes) -> bytes:
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    return reader.read()


def z(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(data)


@pytest.fixture
def sid(new_session: SessionFactory, stubs: Stubs) -> str:
    s = new_session()
    zimport(stubs, s.session_id, z(make_tar(dir_("keep"), member("keep/old.txt", b"old\n"))))
    return s.session_id


def test_the_server_says_it_has_zstd(stubs: Stubs) -> None:
    admin = admin_pb2_grpc.AdminServiceStub(stubs.channel)
    info = admin.GetServerInfo(admin_pb2.GetServerInfoRequest())
    assert "archive_zstd" in info.features


def test_compressed_import_then_export_round_trip(stubs: Stubs, sid: str) -> None:
    source = b"def main():\n    return 42\n" * 4000
    data = make_tar(
        dir_("src"),
        member("src/main.py", source, mode=0o755),
        member("suid", b"#!/bin/sh\n", mode=0o6755),
        symlink("src/link", "main.py"),
    )
    reply = zimport(stubs, sid, z(data))
    assert reply.files == 4
    assert reply.content_bytes == len(source) + 10
    assert run(stubs, sid, "stat", "-c", "%a", "suid").stdout.strip() == b"755"
    out, kinds = zexport(stubs, sid)
    assert kinds == {ZSTD}
    assert len(out) < len(source) // 10  # compressed inside the sandbox
    with tarfile.open(fileobj=io.BytesIO(unzstd(out))) as tar:
        names = {m.name.removeprefix("./"): m for m in tar.getmembers()}
        assert tar.extractfile(names["src/main.py"]).read() == source  # type: ignore[union-attr]
        assert names["src/link"].issym() and names["src/link"].linkname == "main.py"
        assert "keep/old.txt" in names
    # A plain export of the same workspace still is a plain tar (an old client's view).
    plain = snap_stub(stubs).ExportArchive(snapshot_pb2.ExportArchiveRequest(session_id=sid))
    replies = list(plain)
    assert {r.compression for r in replies} == {snapshot_pb2.ARCHIVE_COMPRESSION_UNSPECIFIED}
    assert tarfile.open(fileobj=io.BytesIO(b"".join(r.chunk.data for r in replies)))


@pytest.mark.parametrize("case", sorted(BAD_ARCHIVES))
def test_every_refused_archive_is_refused_compressed_and_changes_nothing(
    stubs: Stubs, sid: str, case: str
) -> None:
    data, code, reason = BAD_ARCHIVES[case]
    before = tree(stubs, sid)
    expect_error(lambda: zimport(stubs, sid, z(data), chunk=3000), code, reason)
    assert tree(stubs, sid) == before
    expect_error(lambda: zimport(stubs, sid, z(data), replace=True), code, reason)
    assert tree(stubs, sid) == before


def test_bytes_that_are_not_zstd_are_refused_and_change_nothing(stubs: Stubs, sid: str) -> None:
    before = tree(stubs, sid)
    garbage = secrets.token_bytes(8192)
    expect_error(lambda: zimport(stubs, sid, garbage), IA, "ARCHIVE_COMPRESSION_INVALID")
    # A good start, then damage: the members before it never land.
    tar = make_tar(dir_("fresh"), member("fresh/ok.txt", secrets.token_bytes(50_000)))
    good = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(tar)
    damaged = good[:-2000] + bytes(b ^ 0x5A for b in good[-2000:-1900]) + good[-1900:]
    err = expect_error(lambda: zimport(stubs, sid, damaged, replace=True), IA)
    assert error_info(err).reason in ("ARCHIVE_COMPRESSION_INVALID", "ARCHIVE_INVALID")
    assert tree(stubs, sid) == before


def test_a_small_archive_decoding_past_the_workspace_is_refused(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    s = new_session(limits=common_pb2.ResourceLimits(workspace_bytes=MiB, file_bytes=MiB))
    before = tree(stubs, s.session_id)
    info = tarfile.TarInfo("zeros")
    info.size = 1 << 40  # a header that lies, then zeros: what a bomb decodes to
    bomb = z(info.tobuf(tarfile.PAX_FORMAT) + bytes(64 * MiB))
    assert len(bomb) < 64 * 1024
    expect_error(lambda: zimport(stubs, s.session_id, bomb), RE, "FILE_TOO_LARGE")
    # Members each within the file cap, together past the workspace: a few KiB compressed.
    many = z(make_tar(*(member(f"z{i}", bytes(512 * 1024)) for i in range(8))))
    assert len(many) < 64 * 1024
    expect_error(lambda: zimport(stubs, s.session_id, many), RE, "WORKSPACE_FULL")
    assert tree(stubs, s.session_id) == before


def test_a_compressed_sparse_export_stops_at_the_uncompressed_cap(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    s = new_session(limits=common_pb2.ResourceLimits(workspace_bytes=MiB))
    assert run(stubs, s.session_id, "truncate", "-s", "10G", "big").exit_code == 0
    with pytest.raises(grpc.RpcError) as excinfo:
        zexport(stubs, s.session_id)
    assert excinfo.value.code() == RE, excinfo.value.details()  # type: ignore[attr-defined]
    assert error_info(excinfo.value).reason == "ARCHIVE_TOO_LARGE"


def test_an_unknown_compression_is_refused(stubs: Stubs, sid: str) -> None:
    expect_error(
        lambda: zimport(stubs, sid, make_tar(member("a")), compression=77),
        IA,
        "ARCHIVE_COMPRESSION_UNSUPPORTED",
    )
    expect_error(
        lambda: list(
            snap_stub(stubs).ExportArchive(
                snapshot_pb2.ExportArchiveRequest(session_id=sid, compression=77)  # type: ignore[arg-type]
            )
        ),
        IA,
        "ARCHIVE_COMPRESSION_UNSUPPORTED",
    )
