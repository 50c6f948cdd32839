"""Compressed archives (sandboxd.archive.compressed) and the helper's `zpack` / `zunpack`: the
recipe the import thread writes rebuilds, inside the sandbox, exactly the stream a plain
import hands tar; the checks and caps hold on the decoded archive. Host only, no Docker."""

from __future__ import annotations

import asyncio
import io
import struct
import subprocess
import tarfile
from collections.abc import Iterator

import pytest
import zstandard
from sandboxd.archive import check_and_forward, compressed, pipe
from sandboxd.archive.policy import ArchiveLimits, MemberChecker
from sandboxd.errors import InvalidArgument, ResourceExhausted

LIMITS = ArchiveLimits(100, 8 << 20, 16 << 20)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _tar(*members: tuple[str, bytes], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        d = tarfile.TarInfo("dir")
        d.type, d.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(d)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o4755  # setuid: the server's header drops it
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zstd_frames(data: bytes, frames: int = 3) -> bytes:
    """`data` as several concatenated frames (a client may send them so)."""
    step = -(-len(data) // frames)
    cctx = zstandard.ZstdCompressor(level=3)
    return b"".join(cctx.compress(data[i : i + step]) for i in range(0, len(data), step))


def _inbox(loop: asyncio.AbstractEventLoop, data: bytes, chunk: int = 4000) -> pipe.Inbox:
    inbox = pipe.Inbox(loop, limit=len(data) + 1)
    for i in range(0, len(data), chunk):
        inbox._items.append(data[i : i + chunk])
    inbox.end()
    return inbox


def _chunks(data: bytes, chunk: int = 4000) -> list[bytes]:
    return [data[i : i + chunk] for i in range(0, len(data), chunk)]


def _plain(loop: asyncio.AbstractEventLoop, tar: bytes) -> bytes:
    outbox = pipe.Outbox(loop, limit=1 << 30)
    check_and_forward(pipe.Source(_inbox(loop, tar)), pipe.Sink(outbox), MemberChecker(LIMITS))
    return b"".join(bytes(x) for x in outbox._items)


def _recipe(
    loop: asyncio.AbstractEventLoop, z: bytes, limits: ArchiveLimits = LIMITS
) -> tuple[tuple[int, int], bytes]:
    outbox = pipe.Outbox(loop, limit=1 << 30)
    decoded = compressed.Decoded(
        _inbox(loop, z), compressed.decoded_cap(limits.max_total_bytes, limits.max_members)
    )
    counts = check_and_forward(
        pipe.Source(decoded), compressed.RecipeSink(outbox), MemberChecker(limits)
    )
    return counts, b"".join(bytes(x) for x in outbox._items)


def _zunpack(sbx: str, stdin: bytes, *command: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sbx, "zunpack", "--", *(command or ("cat",))],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_the_recipe_rebuilds_in_the_helper_exactly_what_a_plain_import_gives_tar(
    loop: asyncio.AbstractEventLoop, sbx: str
) -> None:
    big = bytes(range(256)) * 3000  # over one batch: copies split and joined again
    tar = _tar(("dir/" + "n" * 150, b"long name"), ("dir/big", big), ("small", b"x" * 700))
    z = _zstd_frames(tar)
    (members, content), recipe = _recipe(loop, z)
    assert (members, content) == (4, 9 + len(big) + 700)
    relayed = b"".join(r for c in _chunks(z) for r in compressed.relay_records(c))
    done = _zunpack(sbx, relayed + recipe)
    assert done.returncode == 0, done.stderr
    plain = _plain(loop, tar)
    assert done.stdout == plain
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as out:
        assert not any(m.mode & 0o6000 for m in out.getmembers())  # the server's headers
    assert b"setuid" not in recipe and len(recipe) < len(plain) // 10  # headers, not content


def test_tar_extracts_a_compressed_import_through_the_helper(
    loop: asyncio.AbstractEventLoop, sbx: str, tmp_path: object
) -> None:
    tar = _tar(("dir/a", b"alpha"), ("b", b"beta" * 1000))
    z = compressed.compress(tar)
    _, recipe = _recipe(loop, z)
    dest = __import__("pathlib").Path(str(tmp_path))
    done = subprocess.run(
        [sbx, "zunpack", "--", "tar", "-x", "-o", "-f", "-", "-C", str(dest)],
        input=b"".join(compressed.relay_records(z)) + recipe,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (dest / "dir" / "a").read_bytes() == b"alpha"
    assert (dest / "b").read_bytes() == b"beta" * 1000


def test_a_member_a_plain_import_refuses_is_refused_compressed_too(
    loop: asyncio.AbstractEventLoop,
) -> None:
    with pytest.raises(InvalidArgument) as exc:
        _recipe(loop, compressed.compress(_tar(("../escape", b"x"))))
    assert exc.value.reason == "ARCHIVE_PATH_TRAVERSAL"


def test_a_small_archive_that_decodes_to_more_than_the_import_could_hold_is_refused(
    loop: asyncio.AbstractEventLoop,
) -> None:
    limits = ArchiveLimits(10, 1 << 20, 1 << 20)
    cap = compressed.decoded_cap(limits.max_total_bytes, limits.max_members)
    bomb = compressed.compress(bytes(cap + (4 << 20)))  # zeros: a few KiB compressed
    assert len(bomb) < 64 * 1024
    decoded = compressed.Decoded(_inbox(loop, bomb), cap)
    with pytest.raises(ResourceExhausted) as exc:
        while decoded.get() is not None:
            pass
    assert exc.value.reason == "WORKSPACE_FULL"
    assert decoded.decoded <= cap + compressed.DECODE_BYTES


def test_garbage_and_a_window_over_the_limit_are_compression_invalid(
    loop: asyncio.AbstractEventLoop,
) -> None:
    with pytest.raises(InvalidArgument) as exc:
        _recipe(loop, b"this is not zstd at all" * 100)
    assert exc.value.reason == "ARCHIVE_COMPRESSION_INVALID"
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=27)
    cobj = zstandard.ZstdCompressor(compression_params=params)
    big_window = cobj.compressobj()
    z = big_window.compress(_tar(("a", b"x"))) + big_window.flush()
    with pytest.raises(InvalidArgument) as exc:
        _recipe(loop, z)
    assert exc.value.reason == "ARCHIVE_COMPRESSION_INVALID"


def test_the_recipe_is_held_to_the_caps_a_plain_import_is(
    loop: asyncio.AbstractEventLoop,
) -> None:
    tar = _tar(("a", b"y" * 90_000), ("b", b"z" * 90_000), ("c", b"w" * 90_000))
    limits = ArchiveLimits(100, 1 << 20, 200_000)
    refused: list[tuple[type[Exception], str]] = []
    for source, sink in (
        (pipe.Source(_inbox(loop, tar)), pipe.Sink(pipe.Outbox(loop, limit=1 << 30))),
        (
            pipe.Source(compressed.Decoded(_inbox(loop, compressed.compress(tar)), 1 << 30)),
            compressed.RecipeSink(pipe.Outbox(loop, limit=1 << 30)),
        ),
    ):
        with pytest.raises((ResourceExhausted, InvalidArgument)) as exc:
            check_and_forward(source, sink, MemberChecker(limits))
        refused.append((type(exc.value), exc.value.reason))
    assert refused[0] == refused[1]


def test_zunpack_refuses_a_copy_of_bytes_never_sent(sbx: str) -> None:
    z = compressed.compress(b"abc")
    stdin = b"".join(compressed.relay_records(z)) + struct.pack(">cIQ", b"C", 8, 10)
    done = _zunpack(sbx, stdin)
    assert done.returncode == 125
    assert b"past the compressed bytes" in done.stderr
    assert done.stdout == b"abc"  # what there was, and not a byte more


def test_zunpack_ends_with_its_commands_status(sbx: str) -> None:
    assert _zunpack(sbx, b"", "sh", "-c", "exit 3").returncode == 3


def test_zpack_compresses_the_commands_output_and_caps_it_uncompressed(sbx: str) -> None:
    ok = subprocess.run(
        [sbx, "zpack", "1", "100000", "--", "head", "-c", "50000", "/dev/zero"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert len(ok.stdout) < 1000
    assert zstandard.ZstdDecompressor().decompress(ok.stdout, max_output_size=1 << 20) == bytes(
        50000
    )
    over = subprocess.run(
        [sbx, "zpack", "1", "40000", "--", "head", "-c", "50000", "/dev/zero"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert over.returncode == 125
    assert b'"error":"TOO_LARGE"' in over.stderr
