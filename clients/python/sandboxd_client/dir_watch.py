"""Directory watches (FilesystemService.WatchDir): `Session.watch_dir` and `Session.watching`,
and the typed `FileEvent` they yield. A mixin of `Session`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import grpc

from sandboxd_client._convert import enum_name
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import rpc
from sandboxd_client.errors import from_rpc_error

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import filesystem_pb2, watch_pb2
else:  # loaded on first use (sandboxd_client._lazy)
    filesystem_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.filesystem_pb2")
    watch_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.watch_pb2")

if TYPE_CHECKING:
    from sandboxd_client.client import SandboxClient

READY_HEADER = "sandboxd-watch"


@dataclass(frozen=True)
class FileEvent:
    """One change beneath a watched directory. `kind`: CREATED, MODIFIED, REMOVED, RENAMED
    (`old_path` to `path`), ATTRIBUTES or OVERFLOW (events were lost: list the directory
    again). `path` is relative to /workspace; `type` FILE, DIRECTORY, SYMLINK, OTHER or
    UNSPECIFIED (gone before the watcher looked). `sequence` counts 1, 2, 3... per watch."""

    sequence: int
    kind: str
    path: str
    old_path: str = ""
    type: str = "UNSPECIFIED"

    @classmethod
    def from_pb(cls, msg: Any) -> Self:
        return cls(
            sequence=msg.sequence,
            kind=enum_name(watch_pb2.FileEventKind, msg.kind, "FILE_EVENT_KIND_"),
            path=msg.path,
            old_path=msg.old_path,
            type=enum_name(filesystem_pb2.FileType, msg.type, "FILE_TYPE_"),
        )


class DirWatching:
    """WatchDir for `Session`; the host class provides `_client` and `id`."""

    _client: SandboxClient

    @property
    def id(self) -> str:
        raise NotImplementedError

    async def _watch_call(self, path: str, recursive: bool, timeout: float | None) -> Any:
        """A started WatchDir call, returned once the watch is in place (its headers came)."""
        deadline = self._client._deadline(timeout)
        await self._client._check(deadline)
        req = watch_pb2.WatchDirRequest(session_id=self.id, path=path, recursive=recursive)
        call = self._client.stubs.files.WatchDir(req, timeout=self._client._remaining(deadline))
        try:
            headers = dict(await call.initial_metadata() or ())
            if READY_HEADER not in headers:
                # Refused before the watch was in place: the status says why.
                async for _ in call:
                    pass
        except grpc.RpcError as err:
            call.cancel()
            raise from_rpc_error(err, self._client.address) from None
        return call

    async def _events_of(self, call: Any) -> AsyncGenerator[FileEvent, None]:
        try:
            async for resp in call:
                yield FileEvent.from_pb(resp.event)
        except grpc.RpcError as err:
            exc = from_rpc_error(err, self._client.address)
        else:
            return
        finally:
            call.cancel()  # leaving the loop ends the watch (and its watcher in the sandbox)
        raise exc

    @rpc("FilesystemService/WatchDir")
    async def watch_dir(
        self, path: str = "", *, recursive: bool = False, timeout: float | None = None
    ) -> AsyncIterator[FileEvent]:
        """Changes beneath `path` (a directory; "" is /workspace) as they happen, until the
        loop is left or the session ends. Changes made before the first event is awaited may
        be missed: use `watching` to act only once the watch is in place."""
        call = await self._watch_call(path, recursive, timeout)
        async for event in self._events_of(call):
            yield event

    @contextlib.asynccontextmanager
    async def watching(
        self, path: str = "", *, recursive: bool = False, timeout: float | None = None
    ) -> AsyncIterator[AsyncIterator[FileEvent]]:
        """`async with session.watching("src") as events:` the watch is in place on entry
        (every change made inside the block is reported); leaving the block ends it."""
        call = await self._watch_call(path, recursive, timeout)
        events = self._events_of(call)
        try:
            yield events
        finally:
            await events.aclose()
            call.cancel()


__all__ = ["DirWatching", "FileEvent"]
