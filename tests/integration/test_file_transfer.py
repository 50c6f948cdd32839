"""Streaming file transfer and Move against the real engine: ReadFileStream with
offsets, WriteFileStream all or nothing and past the one-message cap, Move, their bad input;
and the Python client's upload, download and write_files over them."""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import ServerProcess, SessionFactory, Stubs, expect_error, run
from sandboxd.v1 import (
    common_pb2,
    filesystem_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
)
from sandboxd_client import SandboxClient

F = filesystem_pb2
E = filesystem_pb2
MiB = 1024 * 1024


def read_stream(stubs: Stubs, sid: str, path: str, offset: int = 0, length: int = 0) -> bytes:
    req = E.ReadFileStreamRequest(session_id=sid, path=path, offset=offset, length=length)
    got = bytearray()
    for resp in stubs.files.ReadFileStream(req, timeout=60):
        assert resp.chunk.offset == offset + len(got)
        assert len(resp.chunk.data) <= 64 * 1024
        got += resp.chunk.data
    return bytes(got)


def write_requests(
    sid: str, path: str, chunks: list[bytes], **header: object
) -> Iterator[E.WriteFileStreamRequest]:
    yield E.WriteFileStreamRequest(
        header=E.WriteFileStreamHeader(session_id=sid, path=path, **header)  # type: ignore[arg-type]
    )
    for chunk in chunks:
        yield E.WriteFileStreamRequest(data=chunk)


def write_stream(
    stubs: Stubs, sid: str, path: str, chunks: list[bytes], **header: object
) -> F.FileInfo:
    resp = stubs.files.WriteFileStream(write_requests(sid, path, chunks, **header), timeout=120)
    return resp.info  # type: ignore[no-any-return]


def uploads_left(stubs: Stubs, sid: str) -> list[str]:
    # Uploads and the writer's own temp files.
    out = run(stubs, sid, "find", ".", "-name", ".sbx-*").stdout.decode()
    return out.split()


def test_a_file_past_the_message_cap_streams_both_ways(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    limits = common_pb2.ResourceLimits(file_bytes=1 * MiB, workspace_bytes=256 * MiB)
    sid = new_session(limits=limits).session_id
    content = secrets.token_bytes(5 * MiB + 123)
    chunks = [content[i : i + 300_000] for i in range(0, len(content), 300_000)]
    info = write_stream(stubs, sid, "big/blob.bin", chunks, make_parents=True, mode=0o600)
    assert info.size == len(content) and info.mode == 0o600 and info.path == "big/blob.bin"
    digest = run(stubs, sid, "sha256sum", "big/blob.bin").stdout.split()[0].decode()
    assert digest == hashlib.sha256(content).hexdigest()
    assert read_stream(stubs, sid, "big/blob.bin") == content
    # Offsets and lengths.
    assert (
        read_stream(stubs, sid, "big/blob.bin", offset=MiB, length=70_000)
        == content[MiB : MiB + 70_000]
    )
    assert read_stream(stubs, sid, "big/blob.bin", offset=len(content) - 5) == content[-5:]
    assert read_stream(stubs, sid, "big/blob.bin", offset=len(content)) == b""
    # The one-message ReadFile still refuses it, as before.
    expect_error(
        lambda: stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path="big/blob.bin")),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "FILE_TOO_LARGE",
    )
    assert uploads_left(stubs, sid) == []


def test_write_stream_is_all_or_nothing(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    write_stream(stubs, sid, "keep.txt", [b"original"])

    def failing() -> Iterator[E.WriteFileStreamRequest]:
        yield from write_requests(sid, "keep.txt", [b"x" * 100_000, b"y" * 100_000])
        # A second header is a protocol error: the call fails after data was sent.
        yield E.WriteFileStreamRequest(header=E.WriteFileStreamHeader(session_id=sid))

    expect_error(
        lambda: stubs.files.WriteFileStream(failing(), timeout=60),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
    assert read_stream(stubs, sid, "keep.txt") == b"original"

    def cancelled() -> Iterator[E.WriteFileStreamRequest]:
        yield from write_requests(sid, "keep.txt", [b"z" * 100_000])
        raise RuntimeError("the client gives up")

    with pytest.raises(grpc.RpcError):
        stubs.files.WriteFileStream(cancelled(), timeout=60)
    assert read_stream(stubs, sid, "keep.txt") == b"original"
    # Nothing of the failed uploads stays: the server removes the upload once its writer
    # ended, and a writer whose EOF the engine lost ends itself (`--idle-ms`, a little over the
    # server's stream idle timeout of 60 s), so this may take that long, never longer.
    deadline = time.monotonic() + 100
    while debris := uploads_left(stubs, sid):
        assert time.monotonic() < deadline, debris
        time.sleep(0.5)


def test_write_stream_bad_input(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    expect_error(
        lambda: stubs.files.WriteFileStream(
            iter([E.WriteFileStreamRequest(data=b"no header")]), timeout=30
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIRST_MESSAGE",
    )
    expect_error(
        lambda: write_stream(stubs, sid, "../out", [b"x"]),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    expect_error(
        lambda: write_stream(stubs, sid, "no/such/dir/f", [b"x"]),
        grpc.StatusCode.NOT_FOUND,
        "FILE_NOT_FOUND",
    )
    run(stubs, sid, "mkdir", "d")
    expect_error(
        lambda: write_stream(stubs, sid, "d", [b"x"]),
        grpc.StatusCode.FAILED_PRECONDITION,
        "IS_A_DIRECTORY",
    )
    expect_error(
        lambda: write_stream(stubs, sid, "f", [b"x"], mode=0o7777777),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_MODE",
    )
    assert uploads_left(stubs, sid) == []


def test_read_stream_bad_input(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    write_stream(stubs, sid, "f", [b"12345"])
    expect_error(
        lambda: read_stream(stubs, sid, "missing"), grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND"
    )
    expect_error(
        lambda: read_stream(stubs, sid, "f", offset=6),
        grpc.StatusCode.OUT_OF_RANGE,
        "OFFSET_OUT_OF_RANGE",
    )
    expect_error(
        lambda: read_stream(stubs, sid, "f", offset=-1),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_OFFSET",
    )
    run(stubs, sid, "ln", "-s", "/etc/passwd", "link")
    expect_error(lambda: read_stream(stubs, sid, "link"), grpc.StatusCode.INVALID_ARGUMENT)


def test_move(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    write_stream(stubs, sid, "a.txt", [b"A"])
    write_stream(stubs, sid, "b.txt", [b"B"])
    run(stubs, sid, "mkdir", "dir")
    moved = stubs.files.Move(
        E.MoveRequest(session_id=sid, source_path="a.txt", destination_path="dir/a2.txt")
    ).info
    assert moved.path == "dir/a2.txt" and moved.size == 1
    assert read_stream(stubs, sid, "dir/a2.txt") == b"A"
    expect_error(
        lambda: read_stream(stubs, sid, "a.txt"), grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND"
    )
    expect_error(
        lambda: stubs.files.Move(
            E.MoveRequest(session_id=sid, source_path="b.txt", destination_path="dir/a2.txt")
        ),
        grpc.StatusCode.ALREADY_EXISTS,
        "FILE_EXISTS",
    )
    stubs.files.Move(
        E.MoveRequest(
            session_id=sid, source_path="b.txt", destination_path="dir/a2.txt", overwrite=True
        )
    )
    assert read_stream(stubs, sid, "dir/a2.txt") == b"B"
    # Folders move too; a symlink moves as itself, never followed.
    run(stubs, sid, "ln", "-s", "/etc", "etc-link")
    stubs.files.Move(E.MoveRequest(session_id=sid, source_path="dir", destination_path="dir2"))
    stubs.files.Move(
        E.MoveRequest(session_id=sid, source_path="etc-link", destination_path="dir2/l")
    )
    assert run(stubs, sid, "readlink", "dir2/l").stdout == b"/etc\n"
    for src, dst, code, reason in (
        ("missing", "x", grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND"),
        ("dir2/a2.txt", "nodir/x", grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND"),
        ("dir2/a2.txt", "../x", grpc.StatusCode.INVALID_ARGUMENT, None),
        ("dir2/a2.txt", "dir2/l/passwd", grpc.StatusCode.INVALID_ARGUMENT, None),
        ("", "x", grpc.StatusCode.INVALID_ARGUMENT, None),
    ):
        expect_error(
            lambda src=src, dst=dst: stubs.files.Move(  # type: ignore[misc]
                E.MoveRequest(session_id=sid, source_path=src, destination_path=dst)
            ),
            code,
            reason,
        )


async def test_python_client_upload_download_write_files(
    server: ServerProcess, tmp_path: Path
) -> None:
    local = tmp_path / "src"
    (local / "sub").mkdir(parents=True)
    (local / "a.txt").write_bytes(b"alpha")
    big = os.urandom(3 * MiB)
    (local / "sub" / "big.bin").write_bytes(big)
    async with SandboxClient(server.address) as client:
        session = await client.create_session(allow_all=True)
        async with session:
            written = await session.upload(local, "up")
            assert sorted(i.path for i in written) == ["up/a.txt", "up/sub/big.bin"]
            await session.upload(local / "a.txt", "single.txt")
            assert await session.read_file("single.txt") == b"alpha"
            got = await session.write_files({"w/one": b"1", "w/two": b"2" * 200_000})
            assert [i.size for i in got] == [1, 200_000]
            out = tmp_path / "out"
            paths = await session.download("up", out)
            assert sorted(p.relative_to(out).as_posix() for p in paths) == [
                "a.txt",
                "sub/big.bin",
            ]
            assert (out / "sub" / "big.bin").read_bytes() == big
            await session.download("w/two", tmp_path / "two")
            assert (tmp_path / "two").read_bytes() == b"2" * 200_000
            chunks = [c async for c in session.read_file_stream("up/sub/big.bin", offset=10)]
            assert b"".join(chunks) == big[10:]
            info = await session.move("single.txt", "moved.txt")
            assert info.path == "moved.txt"


def test_export_archive_of_a_single_file(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    write_stream(stubs, sid, "dir/-odd name.txt", [b"one file"], make_parents=True, mode=0o640)
    write_stream(stubs, sid, "dir/other.txt", [b"not this"])
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)
    req = snapshot_pb2.ExportArchiveRequest(session_id=sid, path="dir/-odd name.txt")
    data = b"".join(r.chunk.data for r in snaps.ExportArchive(req, timeout=60))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["./-odd name.txt"]
        assert members[0].mode & 0o777 == 0o640
        extracted = tar.extractfile(members[0])
        assert extracted is not None and extracted.read() == b"one file"
    # A folder exports as before: its contents under ".".
    req = snapshot_pb2.ExportArchiveRequest(session_id=sid, path="dir")
    data = b"".join(r.chunk.data for r in snaps.ExportArchive(req, timeout=60))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert sorted(tar.getnames()) == [".", "./-odd name.txt", "./other.txt"]
