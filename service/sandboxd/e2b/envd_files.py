"""envd's `filesystem.Filesystem` as FilesystemService calls.

Paths are translated by `wire.to_workspace` (home and relative paths are the workspace) and
then meet sandboxd's own rules: a path outside /workspace, `..`, or a symlink leading out is
refused by the gRPC server with INVALID_ARGUMENT, as for any client.
"""

from __future__ import annotations

import posixpath
from collections.abc import AsyncIterator
from typing import Any

import grpc

from sandboxd.e2b.backend import Backend, metadata
from sandboxd.e2b.connect import ConnectError
from sandboxd.e2b.wire import field, text, timestamp, to_home, to_workspace, uint
from sandboxd.file_transfer import UPLOAD_PREFIX
from sandboxd.v1 import filesystem_pb2, watch_pb2

FILE_TYPES = {
    filesystem_pb2.FILE_TYPE_FILE: "FILE_TYPE_FILE",
    filesystem_pb2.FILE_TYPE_DIRECTORY: "FILE_TYPE_DIRECTORY",
    filesystem_pb2.FILE_TYPE_SYMLINK: "FILE_TYPE_SYMLINK",
}
EVENT_TYPES = {
    watch_pb2.FILE_EVENT_KIND_CREATED: "EVENT_TYPE_CREATE",
    watch_pb2.FILE_EVENT_KIND_MODIFIED: "EVENT_TYPE_WRITE",
    watch_pb2.FILE_EVENT_KIND_REMOVED: "EVENT_TYPE_REMOVE",
    watch_pb2.FILE_EVENT_KIND_RENAMED: "EVENT_TYPE_RENAME",
    watch_pb2.FILE_EVENT_KIND_ATTRIBUTES: "EVENT_TYPE_CHMOD",
}
MAX_LIST_PAGES = 64


def absolute(path: str) -> str:
    """sandboxd's replies name paths relative to /workspace or absolute: E2B's are absolute."""
    full = path if path.startswith("/") else posixpath.join("/workspace", path)
    return to_home(posixpath.normpath(full))


def entry(info: filesystem_pb2.FileInfo) -> dict[str, Any]:
    path = absolute(info.path)
    out: dict[str, Any] = {
        "name": info.name or posixpath.basename(path),
        "type": FILE_TYPES.get(info.type, "FILE_TYPE_UNSPECIFIED"),
        "path": path,
        "size": str(info.size_bytes),
        "mode": info.mode,
        "permissions": _permissions(info.mode, info.type),
        "owner": "user",
        "group": "user",
    }
    if info.HasField("modified_at"):
        out["modifiedTime"] = timestamp(info.modified_at)
    if info.symlink_target:
        out["symlinkTarget"] = info.symlink_target
        out["isSymlink"] = True
    return out


def _permissions(mode: int, kind: int) -> str:
    head = "d" if kind == filesystem_pb2.FILE_TYPE_DIRECTORY else "-"
    if kind == filesystem_pb2.FILE_TYPE_SYMLINK:
        head = "l"
    bits = "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))
    return head + bits


def _path(req: dict[str, Any], name: str = "path") -> str:
    return to_workspace(text(req, name))


class FilesystemRpcs:
    def __init__(self, backend: Backend) -> None:
        self._b = backend

    async def _stat(self, key: str, sid: str, path: str) -> dict[str, Any]:
        got = await self._b.files.Stat(
            filesystem_pb2.StatRequest(session_id=sid, path=path), metadata=metadata(key)
        )
        return entry(got.info)

    async def stat(self, key: str, sid: str, req: dict[str, Any]) -> dict[str, Any]:
        return {"entry": await self._stat(key, sid, _path(req))}

    async def list_dir(self, key: str, sid: str, req: dict[str, Any]) -> dict[str, Any]:
        depth = uint(req, "depth") or 1
        if depth > 32:
            raise ConnectError("invalid_argument", "depth is at most 32")
        out: list[dict[str, Any]] = []
        token = ""
        for _ in range(MAX_LIST_PAGES):
            got = await self._b.files.ListDir(
                filesystem_pb2.ListDirRequest(
                    session_id=sid, path=_path(req), depth=depth, page_size=1000, page_token=token
                ),
                metadata=metadata(key),
            )
            out += [entry(e) for e in got.entries]
            token = got.next_page_token
            if not token:
                return {"entries": out}
        raise ConnectError("resource_exhausted", "the directory has too many entries to list")

    async def make_dir(self, key: str, sid: str, req: dict[str, Any]) -> dict[str, Any]:
        path = _path(req)
        try:
            await self._stat(key, sid, path)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
        else:
            raise ConnectError("already_exists", f"{to_home(path)} already exists")
        got = await self._b.files.MakeDir(
            filesystem_pb2.MakeDirRequest(session_id=sid, path=path, make_parents=True),
            metadata=metadata(key),
        )
        return {"entry": entry(got.info)}

    async def move(self, key: str, sid: str, req: dict[str, Any]) -> dict[str, Any]:
        destination = _path(req, "destination")
        await self._b.files.Move(
            filesystem_pb2.MoveRequest(
                session_id=sid, source_path=_path(req, "source"), destination_path=destination
            ),
            metadata=metadata(key),
        )
        return {"entry": await self._stat(key, sid, destination)}

    async def remove(self, key: str, sid: str, req: dict[str, Any]) -> dict[str, Any]:
        await self._b.files.Remove(
            filesystem_pb2.RemoveRequest(session_id=sid, path=_path(req), recursive=True),
            metadata=metadata(key),
        )
        return {}

    async def watch_dir(
        self, key: str, sid: str, req: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        root = _path(req)
        call = self._b.files.WatchDir(
            watch_pb2.WatchDirRequest(
                session_id=sid, path=root, recursive=bool(field(req, "recursive", False))
            ),
            metadata=metadata(key),
        )
        try:
            await call.initial_metadata()  # the watch is in place: E2B's start event
            yield {"start": {}}
            async for r in call:
                if r.event.kind == watch_pb2.FILE_EVENT_KIND_OVERFLOW:
                    raise ConnectError(
                        "data_loss", "events were lost (a burst or the watch limit): list again"
                    )
                for event in filesystem_events(r.event, root):
                    yield {"filesystem": event}
        finally:
            call.cancel()


def _is_upload(name: str) -> bool:
    """sandboxd's streaming writes land in a temporary file renamed into place at the end."""
    base = posixpath.basename(name)
    return base.startswith(UPLOAD_PREFIX) and base.endswith(".part")


def filesystem_events(e: filesystem_pb2.FileEvent, root: str) -> list[dict[str, Any]]:
    """E2B's events name the entry relative to the watched directory, and a rename as envd's
    inotify reports it: RENAME of the old name, CREATE of the new one. An upload's temporary
    file is not reported: its rename into place is the file's CREATE."""
    kind = EVENT_TYPES.get(e.kind)
    if kind is None:
        return []

    def name(path: str) -> str:
        full = path if path.startswith("/") else posixpath.join("/workspace", path)
        return posixpath.relpath(full, root)

    if e.kind == watch_pb2.FILE_EVENT_KIND_RENAMED:
        out = [] if _is_upload(e.old_path) else [{"name": name(e.old_path), "type": kind}]
        return out + [{"name": name(e.path), "type": "EVENT_TYPE_CREATE"}]
    if _is_upload(e.path):
        return []
    return [{"name": name(e.path), "type": kind}]
