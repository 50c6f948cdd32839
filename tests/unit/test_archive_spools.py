"""Unit tests of the replace imports' reused spools (sandboxd.archive.spools)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sandboxd.archive.spools import Spool, Spools


async def _read(spool: Spool) -> bytes:
    return b"".join([chunk async for chunk in spool.read_back()])


async def test_a_reused_spool_reads_back_only_what_its_own_import_wrote(tmp_path: Path) -> None:
    spools = Spools(tmp_path, keep=1)
    first = await spools.take()
    first.write(b"A" * 700_000)
    first.settled = True
    spools.give_back(first)
    second = await spools.take()
    assert second.file is first.file  # the same file, its pages already there
    second.write(b"b" * 1000)
    second.write(b"c" * 10)
    assert await _read(second) == b"b" * 1000 + b"c" * 10  # not the first import's tail
    assert list(tmp_path.iterdir()) == []  # unlinked from the start
    second.file.close()


async def test_an_empty_import_reads_back_nothing(tmp_path: Path) -> None:
    spools = Spools(tmp_path)
    first = await spools.take()
    first.write(b"old")
    first.settled = True
    spools.give_back(first)
    again = await spools.take()
    assert await _read(again) == b""
    again.file.close()


async def test_a_spool_whose_writer_may_still_run_is_never_handed_out_again(
    tmp_path: Path,
) -> None:
    spools = Spools(tmp_path)
    spool = await spools.take()
    spool.write(b"x")
    spools.give_back(spool)  # not settled: a cancelled call's thread may still write
    await asyncio.sleep(0.05)  # closed on an executor thread
    assert spool.file.closed
    other = await spools.take()
    assert other.file is not spool.file
    other.file.close()


async def test_only_a_few_small_spools_are_kept(tmp_path: Path) -> None:
    spools = Spools(tmp_path, keep=1, keep_bytes=100)
    big, small, extra = await spools.take(), await spools.take(), await spools.take()
    for spool, size in ((big, 101), (small, 100), (extra, 1)):
        spool.write(b"z" * size)
        spool.settled = True
        spools.give_back(spool)
    await asyncio.sleep(0.05)
    assert big.file.closed  # larger than keep_bytes
    assert not small.file.closed  # kept
    assert extra.file.closed  # the pool was full
    spools.close()
    assert small.file.closed
