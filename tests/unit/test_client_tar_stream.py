"""The Python client's folder streams (sandboxd_client.tar_stream), without a server: a tar
made as it is read is the folder, and a bad or broken stream ends with its error, never a hang
and never a half folder."""

from __future__ import annotations

import asyncio
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sandboxd_client.tar_stream import CHUNK, tar_chunks, untar_chunks


def _tree(root: Path) -> dict[str, tuple[bool, int, bytes]]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        link = p.is_symlink()
        data = os.readlink(p).encode() if link else (p.read_bytes() if p.is_file() else b"")
        out[p.relative_to(root).as_posix()] = (link, st.st_mode & 0o777, data)
    return out


def test_a_folder_through_both_streams_is_the_folder(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "run.sh").write_bytes(b"echo\n")
    (src / "a" / "run.sh").chmod(0o755)
    (src / "big").write_bytes(os.urandom(5 * CHUNK + 3))
    (src / "a" / "link").symlink_to("run.sh")

    async def go() -> None:
        await untar_chunks(tar_chunks(src), tmp_path / "out")

    asyncio.run(asyncio.wait_for(go(), 30))
    assert _tree(tmp_path / "out") == _tree(src)


async def _garbage(n: int) -> AsyncIterator[bytes]:
    for _ in range(n):
        yield b"\xff" * CHUNK


def test_a_bad_archive_of_many_chunks_fails_and_leaves_nothing(tmp_path: Path) -> None:
    """More chunks than the queue holds come after the unpacker stopped: the feeder stops too
    (it waits for room at most half a second at a time, then looks whether the unpacker is
    still there)."""
    dest = tmp_path / "dest"
    with pytest.raises(tarfile.TarError):
        asyncio.run(asyncio.wait_for(untar_chunks(_garbage(64), dest), 30))
    assert not dest.exists()


def test_a_broken_stream_raises_its_own_error(tmp_path: Path) -> None:
    async def broken() -> AsyncIterator[bytes]:
        yield b"\0" * 512
        raise ConnectionError("the server went away")

    with pytest.raises(ConnectionError):
        asyncio.run(asyncio.wait_for(untar_chunks(broken(), tmp_path / "d"), 30))
    assert not (tmp_path / "d").exists()
