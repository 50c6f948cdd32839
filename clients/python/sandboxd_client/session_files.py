"""Session calls on the workspace's files: whole files and folders (ReadFile, WriteFile, ListDir,
Stat, Remove, MakeDir), streaming transfer (ReadFileStream, WriteFileStream) and Move, and the
helpers built on them, `upload`, `download` and `write_files`, which stream a chunk at a time
(never a whole file or a tar in memory) for files up to the session's workspace_bytes.

A mixin of `Session`, kept apart so session.py stays one screenful per concern.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from sandboxd_client._call_end import CallEnd
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import UNSET, rpc

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import filesystem_pb2
else:  # loaded on first use (sandboxd_client._lazy)
    filesystem_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.filesystem_pb2")

if TYPE_CHECKING:
    from sandboxd_client import models
    from sandboxd_client.client import SandboxClient
    from sandboxd_client.models import ArchiveImported, FileInfo
    from sandboxd_client.tar_stream import Progress
else:  # the result dataclasses, on first use (sandboxd_client._lazy)
    models = lazy("sandboxd_client.models")

CHUNK_BYTES = 64 * 1024


async def _file_chunks(f: BinaryIO) -> AsyncIterator[bytes]:
    """A local file's bytes, read off the event loop a chunk at a time."""
    while data := await asyncio.to_thread(f.read, CHUNK_BYTES):
        yield data


async def _chunks_of(data: AsyncIterable[bytes] | Iterable[bytes] | bytes) -> AsyncIterator[bytes]:
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data)
        for i in range(0, len(view), CHUNK_BYTES):
            yield bytes(view[i : i + CHUNK_BYTES])
    elif isinstance(data, AsyncIterable):
        async for chunk in data:
            yield chunk
    else:
        for chunk in data:
            yield chunk


class FileCalls:
    """The FilesystemService calls (but WatchDir: dir_watch.py), upload, download and
    write_files for `Session`."""

    _client: SandboxClient

    @property
    def id(self) -> str:
        raise NotImplementedError

    @property
    def _stubs(self) -> Any:
        return self._client.stubs

    @rpc("FilesystemService/ReadFile")
    async def read_file(self, path: str, *, timeout: float | None = UNSET) -> bytes:
        req = filesystem_pb2.ReadFileRequest(session_id=self.id, path=path)
        resp = await self._client._unary(
            "FilesystemService/ReadFile",
            lambda t: self._stubs.files.ReadFile(req, timeout=t),
            timeout,
        )
        content: bytes = resp.content
        return content

    @rpc("FilesystemService/WriteFile")
    async def write_file(
        self,
        path: str,
        content: bytes,
        *,
        mode: int = 0,
        make_parents: bool = False,
        timeout: float | None = UNSET,
    ) -> FileInfo:
        req = filesystem_pb2.WriteFileRequest(
            session_id=self.id, path=path, content=content, mode=mode, make_parents=make_parents
        )
        resp = await self._client._unary(
            "FilesystemService/WriteFile",
            lambda t: self._stubs.files.WriteFile(req, timeout=t),
            timeout,
        )
        return models.FileInfo.from_pb(resp.info)

    @rpc("FilesystemService/ListDir")
    async def list_dir(
        self,
        path: str = "",
        *,
        depth: int = 0,
        page_size: int = 0,
        timeout: float | None = UNSET,
    ) -> AsyncIterator[FileInfo]:
        """The entries beneath `path`, following pages as the loop goes (`page_size` 0: the
        whole listing in one reply, in walk order; else pages in path order)."""
        async for resp in self._client._paged(
            "FilesystemService/ListDir",
            lambda token, t: self._stubs.files.ListDir(
                filesystem_pb2.ListDirRequest(
                    session_id=self.id,
                    path=path,
                    depth=depth,
                    page_size=page_size,
                    page_token=token,
                ),
                timeout=t,
            ),
            timeout,
        ):
            for e in resp.entries:
                yield models.FileInfo.from_pb(e)

    @rpc("FilesystemService/Stat")
    async def stat(self, path: str, *, timeout: float | None = UNSET) -> FileInfo:
        req = filesystem_pb2.StatRequest(session_id=self.id, path=path)
        resp = await self._client._unary(
            "FilesystemService/Stat", lambda t: self._stubs.files.Stat(req, timeout=t), timeout
        )
        return models.FileInfo.from_pb(resp.info)

    @rpc("FilesystemService/Remove")
    async def remove(
        self, path: str, *, recursive: bool = False, timeout: float | None = UNSET
    ) -> None:
        req = filesystem_pb2.RemoveRequest(session_id=self.id, path=path, recursive=recursive)
        await self._client._unary(
            "FilesystemService/Remove", lambda t: self._stubs.files.Remove(req, timeout=t), timeout
        )

    @rpc("FilesystemService/MakeDir")
    async def make_dir(
        self, path: str, *, parents: bool = False, timeout: float | None = UNSET
    ) -> FileInfo:
        # Both names: a server from before make_parents reads `parents`.
        req = filesystem_pb2.MakeDirRequest(
            session_id=self.id, path=path, parents=parents, make_parents=parents
        )
        resp = await self._client._unary(
            "FilesystemService/MakeDir",
            lambda t: self._stubs.files.MakeDir(req, timeout=t),
            timeout,
        )
        return models.FileInfo.from_pb(resp.info)

    @rpc("FilesystemService/ReadFileStream")
    async def read_file_stream(
        self, path: str, *, offset: int = 0, length: int = 0, deadline: float | None = None
    ) -> AsyncIterator[bytes]:
        """The file's bytes from `offset` (`length` at most; 0: to the end), in chunks."""
        req = filesystem_pb2.ReadFileStreamRequest(
            session_id=self.id, path=path, offset=offset, length=length
        )
        async for resp in self._client._server_stream(
            lambda t: self._stubs.files.ReadFileStream(req, timeout=t), deadline
        ):
            yield resp.chunk.data

    @rpc("FilesystemService/WriteFileStream")
    async def write_file_stream(
        self,
        path: str,
        data: AsyncIterable[bytes] | Iterable[bytes] | bytes,
        *,
        mode: int = 0,
        make_parents: bool = False,
        deadline: float | None = None,
    ) -> FileInfo:
        """Write `data` (bytes, or chunks) to `path`: the file is replaced only once every
        chunk arrived. Never retried: the chunks cannot be replayed."""

        async def requests() -> AsyncIterator[filesystem_pb2.WriteFileStreamRequest]:
            header = filesystem_pb2.WriteFileStreamHeader(
                session_id=self.id, path=path, mode=mode, make_parents=make_parents
            )
            yield filesystem_pb2.WriteFileStreamRequest(header=header)
            async for chunk in _chunks_of(data):
                if chunk:
                    yield filesystem_pb2.WriteFileStreamRequest(data=chunk)

        ends = CallEnd()  # the server's refusal ends the upload: stop reading `data`
        resp = await self._client._unary(
            "FilesystemService/WriteFileStream",
            lambda t: self._stubs.files.WriteFileStream(ends.until_ended(requests()), timeout=t),
            deadline,
            ends=ends,
        )
        return models.FileInfo.from_pb(resp.info)

    @rpc("FilesystemService/Move")
    async def move(
        self,
        source_path: str,
        destination_path: str,
        *,
        overwrite: bool = False,
        timeout: float | None = UNSET,
    ) -> FileInfo:
        """Rename within the workspace; an existing destination needs `overwrite`."""
        req = filesystem_pb2.MoveRequest(
            session_id=self.id,
            source_path=source_path,
            destination_path=destination_path,
            overwrite=overwrite,
        )
        resp = await self._client._unary(
            "FilesystemService/Move", lambda t: self._stubs.files.Move(req, timeout=t), timeout
        )
        return models.FileInfo.from_pb(resp.info)

    async def write_files(
        self, files: Mapping[str, bytes | AsyncIterable[bytes]], *, make_parents: bool = True
    ) -> list[FileInfo]:
        """Write each {path: content}, one streamed write per file."""
        return [
            await self.write_file_stream(path, data, make_parents=make_parents)
            for path, data in files.items()
        ]

    async def upload(self, local: str | os.PathLike[str], remote: str) -> list[FileInfo]:
        """A local file to the file `remote`, or a local folder's files beneath the folder
        `remote`, each streamed from disk. Symlinks in the local folder are skipped."""
        src = Path(local)
        if src.is_file():
            with src.open("rb") as f:
                return [await self.write_file_stream(remote, _file_chunks(f), make_parents=True)]
        if not src.is_dir():
            raise FileNotFoundError(f"{src}: no such file or directory")
        written = []
        for path in sorted(src.rglob("*")):
            if path.is_symlink() or not path.is_file():
                continue
            target = f"{remote.rstrip('/')}/{path.relative_to(src).as_posix()}"
            with path.open("rb") as f:
                info = await self.write_file_stream(target, _file_chunks(f), make_parents=True)
            written.append(info)
        return written

    async def upload_dir(
        self,
        local: str | os.PathLike[str],
        remote: str = "",
        *,
        replace: bool = False,
        progress: Progress | None = None,
    ) -> ArchiveImported:
        """The local folder's contents into the workspace folder `remote` (empty: the
        workspace), in one call: a tar made as it is sent (nothing whole in memory), symlinks
        as symlinks, modes kept (without setuid, setgid, sticky). `replace` swaps the folder's
        old contents for these, all or nothing. `progress(sent, total)` follows the tar's bytes
        (the total is an estimate). The session's per-file cap (`file_bytes`, 1 MiB unless
        the session was created with more, up to the server's `max_file_bytes`) bounds each
        file: a larger one is refused FILE_TOO_LARGE and nothing lands."""
        src = Path(local)
        if not src.is_dir():
            raise NotADirectoryError(f"{src}: not a folder (upload() takes one file)")
        from sandboxd_client.tar_stream import tar_chunks  # tarfile: only for folders

        chunks = tar_chunks(src, progress=progress)
        return await self.import_archive(chunks, remote, replace=replace)  # type: ignore[attr-defined,no-any-return]

    async def download_dir(
        self,
        remote: str,
        local: str | os.PathLike[str],
        *,
        progress: Progress | None = None,
    ) -> int:
        """The workspace folder `remote` (empty: the whole workspace) into the local folder
        `local` (made if missing), unpacked as it arrives; symlinks and modes kept, nothing
        written outside `local`. `progress(received, None)`; returns the tar's size."""
        chunks: AsyncIterator[bytes] = self.export_archive(remote)  # type: ignore[attr-defined]
        from sandboxd_client.tar_stream import untar_chunks

        return await untar_chunks(chunks, Path(local), progress=progress)

    async def download(self, remote: str, local: str | os.PathLike[str]) -> list[Path]:
        """The file `remote` to the local file `local`, or the folder `remote`'s files beneath
        the local folder `local`, each streamed to disk."""
        info = await self.stat(remote)
        dst = Path(local)
        if info.type != "DIRECTORY":
            await self._download_file(remote, dst)
            return [dst]
        got = []
        entries = [e async for e in self.list_dir(remote, depth=32)]
        base = info.path.rstrip("/")
        for entry in entries:
            if entry.type != "FILE":
                continue
            rel = entry.path[len(base) + 1 :] if base not in ("", ".") else entry.path
            target = dst / rel
            if ".." in Path(rel).parts or Path(rel).is_absolute():
                continue  # never write outside `local`, whatever the server says
            await self._download_file(entry.path, target)
            got.append(target)
        return got

    async def _download_file(self, remote: str, dst: Path) -> None:
        await asyncio.to_thread(dst.parent.mkdir, parents=True, exist_ok=True)
        part = dst.with_name(dst.name + ".part")
        f = await asyncio.to_thread(part.open, "wb")
        try:
            async for chunk in self.read_file_stream(remote):
                await asyncio.to_thread(f.write, chunk)
        except BaseException:
            f.close()
            part.unlink(missing_ok=True)
            raise
        f.close()
        await asyncio.to_thread(os.replace, part, dst)
