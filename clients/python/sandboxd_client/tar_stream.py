"""Folders as tar streams, made and unpacked as the bytes move: nothing held whole in memory.

`tar_chunks` walks a local folder with `tarfile` in a worker thread and hands its output over in
chunks through a bounded queue (at most `_DEPTH` chunks wait: the upload's pace is the
server's); `untar_chunks` feeds an export's chunks to `tarfile` in stream mode (`r|`) in a
worker thread, extracting with the "data" filter (nothing outside the destination, no devices,
no setuid). Symlinks travel as symlinks and modes as modes (without setuid, setgid and sticky,
which the server refuses).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import shutil
import tarfile
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable
from pathlib import Path

CHUNK = 256 * 1024
_DEPTH = 8
Progress = Callable[[int, "int | None"], None]  # (bytes so far, the total when known)


class _Abandoned(Exception):
    """The reader of a tar stream went away: the writer stops."""


def _portable(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """No local owners or special bits: the server refuses setuid, setgid and devices."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode &= 0o777
    return info


def estimated_size(local: Path) -> int:
    """About the size of the tar of `local`: its files rounded up to 512-byte blocks, and a
    header each (long names add a little; a progress bar needs no more)."""
    total = 1024  # the end-of-archive blocks
    for root, dirs, files in os.walk(local):
        for name in dirs + files:
            path = Path(root, name)
            total += 512
            if name in files and not path.is_symlink():
                with contextlib.suppress(OSError):
                    total += (path.stat().st_size + 511) // 512 * 512
    return total


class _ChunkWriter:
    """The file object tarfile writes to: cut into chunks, handed to the event loop."""

    def __init__(self, hand_over: Callable[[bytes | None], None], room: threading.Semaphore):
        self._hand_over, self._room = hand_over, room
        self._buffer = bytearray()
        self.abandoned = threading.Event()

    def write(self, data: bytes) -> int:
        self._buffer += data
        while len(self._buffer) >= CHUNK:
            self._send(bytes(self._buffer[:CHUNK]))
            del self._buffer[:CHUNK]
        return len(data)

    def _send(self, chunk: bytes) -> None:
        while not self._room.acquire(timeout=0.5):
            if self.abandoned.is_set():
                raise _Abandoned
        if self.abandoned.is_set():
            raise _Abandoned
        self._hand_over(chunk)

    def close(self) -> None:
        if self._buffer:
            self._send(bytes(self._buffer))
            self._buffer.clear()


async def tar_chunks(
    local: Path, *, arcname: str = "", progress: Progress | None = None
) -> AsyncIterator[bytes]:
    """A tar of `local` (a folder's contents at the top when `arcname` is empty, else under
    `arcname`; a file as `arcname` or its name), in chunks of 256 KiB as tarfile makes them."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Queue[bytes | None | BaseException] = asyncio.Queue()
    room = threading.Semaphore(_DEPTH)

    def hand_over(chunk: bytes | None) -> None:
        loop.call_soon_threadsafe(ready.put_nowait, chunk)

    writer = _ChunkWriter(hand_over, room)
    total = await asyncio.to_thread(estimated_size, local) if progress is not None else None

    def make() -> None:
        try:
            with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                if local.is_dir() and not arcname:
                    for child in sorted(local.iterdir()):
                        tar.add(child, arcname=child.name, filter=_portable)
                else:
                    tar.add(local, arcname=arcname or local.name, filter=_portable)
            writer.close()
            loop.call_soon_threadsafe(ready.put_nowait, None)
        except _Abandoned:
            pass
        except BaseException as exc:  # an unreadable file: the upload fails with it
            loop.call_soon_threadsafe(ready.put_nowait, exc)

    maker = loop.run_in_executor(None, make)
    sent = 0
    try:
        while True:
            item = await ready.get()
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            room.release()
            yield item
            sent += len(item)
            if progress is not None:
                progress(sent, max(total or 0, sent))
    finally:
        writer.abandoned.set()
        await maker


class _ChunkReader:
    """The file object tarfile reads from: the export's chunks, as they arrive."""

    def __init__(self) -> None:
        self.chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=_DEPTH)
        self._current = b""
        self._ended = False

    def read(self, size: int = -1) -> bytes:
        out = bytearray()
        while (size < 0 or len(out) < size) and not self._ended:
            if not self._current:
                chunk = self.chunks.get()
                if chunk is None:
                    self._ended = True
                    break
                self._current = chunk
            take = len(self._current) if size < 0 else size - len(out)
            out += self._current[:take]
            self._current = self._current[take:]
        return bytes(out)


async def untar_chunks(
    chunks: AsyncIterable[bytes], dest: Path, *, progress: Progress | None = None
) -> int:
    """Unpack a tar stream into the folder `dest` (made if missing) as it arrives; its bytes.

    A stream that fails (the server's refusal, a lost connection) raises its own error, and a
    `dest` this call made is removed again: a failed download leaves no half folder behind."""
    reader = _ChunkReader()
    made = not dest.exists()

    def unpack() -> None:
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
            tar.extractall(dest, filter="data")
        while reader.read(CHUNK):  # drain: the feeder never waits on a reader that is done
            pass

    unpacking = asyncio.get_running_loop().run_in_executor(None, unpack)

    async def feed(item: bytes | None) -> bool:
        """Hand `item` to the unpacker; False once it has stopped (a bad archive), so a
        feeder never waits for room a dead reader will not make."""
        while not unpacking.done():
            try:
                await asyncio.to_thread(reader.chunks.put, item, True, 0.5)
                return True
            except queue.Full:
                continue
        return False

    got = 0
    try:
        try:
            async for chunk in chunks:
                if not await feed(chunk):
                    break  # a bad archive: its error is raised below
                got += len(chunk)
                if progress is not None:
                    progress(got, None)
        except BaseException:
            await feed(None)
            with contextlib.suppress(Exception):  # "empty file": the stream's error says why
                await unpacking
            raise
        await feed(None)
        await unpacking
    except BaseException:
        if made:
            await asyncio.to_thread(shutil.rmtree, dest, True)
        raise
    return got
