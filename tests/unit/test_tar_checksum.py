"""The import's tar header checksum (sandboxd.archive.tar_checksum): the same two sums as
tarfile's own for any block, installed where tarfile looks, and a damaged header still
refused by the import's check loop."""

from __future__ import annotations

import asyncio
import io
import random
import tarfile

import pytest
from sandboxd.archive import check_and_forward, pipe, tar_checksum
from sandboxd.archive.policy import ArchiveLimits, MemberChecker
from sandboxd.errors import InvalidArgument


def _blocks() -> list[bytes]:
    rng = random.Random(5)
    made = [bytes(512), b"\xff" * 512, bytes(range(256)) * 2]
    made += [rng.randbytes(512) for _ in range(2000)]
    made += [tarfile.TarInfo(f"d{i}/é{i}").tobuf(tarfile.PAX_FORMAT) for i in range(50)]
    return made


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_the_sums_are_tarfiles_own_for_any_block(kind: type) -> None:
    for block in _blocks():
        assert tar_checksum.calc_chksums(kind(block)) == tar_checksum._ORIGINAL(kind(block))


def test_a_short_block_is_refused_as_tarfile_refuses_it() -> None:
    with pytest.raises(Exception) as ours:
        tar_checksum.calc_chksums(b"x" * 100)
    with pytest.raises(Exception) as theirs:
        tar_checksum._ORIGINAL(b"x" * 100)
    assert type(ours.value) is type(theirs.value)


def _tar(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _check(data: bytes) -> tuple[int, int]:
    loop = asyncio.new_event_loop()
    try:
        inbox = pipe.Inbox(loop, limit=len(data) + 1)
        inbox._items.append(data)
        inbox.end()
        sink = pipe.Sink(pipe.Outbox(loop, limit=1 << 30))
        return check_and_forward(
            pipe.Source(inbox), sink, MemberChecker(ArchiveLimits(9, 1 << 20, 1 << 20))
        )
    finally:
        loop.close()


def test_the_import_uses_it_and_still_refuses_a_header_whose_sum_is_wrong() -> None:
    assert vars(tarfile)["calc_chksums"] is tar_checksum.calc_chksums  # installed by the check loop
    good = _tar("a.txt", b"hello")
    assert _check(good) == (1, 5)
    bad = bytearray(good)
    bad[0] ^= 0x01  # the name changes, the stored checksum does not
    with pytest.raises(InvalidArgument) as exc:
        _check(bytes(bad))
    assert exc.value.reason == "ARCHIVE_INVALID"
