"""Session calls on the workspace as a whole: a folder as a tar stream, out (ExportArchive) and
in (ImportArchive), zstd-compressed on the wire when both ends have it; and the session's
snapshots (CreateSnapshot, ListSnapshots).

A mixin of `Session`, kept apart so session.py stays one screenful per concern.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from sandboxd_client._archive_codec import archive_compression as _archive_compression
from sandboxd_client._archive_codec import tar_codec as _tar_codec
from sandboxd_client._call_end import CallEnd
from sandboxd_client._convert import enum_value
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import UNSET, rpc

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import snapshot_pb2
else:  # loaded on first use (sandboxd_client._lazy)
    snapshot_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.snapshot_pb2")

if TYPE_CHECKING:
    from sandboxd_client import models
    from sandboxd_client.client import SandboxClient
    from sandboxd_client.models import ArchiveImported, SnapshotInfo
else:  # the result dataclasses, on first use (sandboxd_client._lazy)
    models = lazy("sandboxd_client.models")


class ArchiveCalls:
    """ExportArchive, ImportArchive, CreateSnapshot and this session's ListSnapshots for
    `Session`."""

    _client: SandboxClient

    @property
    def id(self) -> str:
        raise NotImplementedError

    @property
    def _stubs(self) -> Any:
        return self._client.stubs

    @rpc("SnapshotService/ExportArchive")
    async def export_archive(
        self, path: str = "", *, deadline: float | None = None, compression: str = "auto"
    ) -> AsyncIterator[bytes]:
        """A tar of the folder `path` (empty: the whole workspace), in chunks as it is made.

        `compression` is how it travels, not what you get (always the plain tar): "auto" asks
        for zstd when the server has it (`archive_zstd`) and zstandard is installed, "zstd"
        asks for it anyway, "none" never does. zstd is made inside the sandbox: the server
        relays fewer bytes and this client decodes them."""
        wire = await _archive_compression(self._client, compression, deadline)
        req = snapshot_pb2.ExportArchiveRequest(session_id=self.id, path=path, compression=wire)
        decoder = None
        async for resp in self._client._server_stream(
            lambda t: self._stubs.snapshots.ExportArchive(req, timeout=t), deadline
        ):
            if resp.compression == snapshot_pb2.ARCHIVE_COMPRESSION_UNSPECIFIED:
                yield resp.chunk.data  # a plain tar (an older server ignores the ask)
                continue
            if decoder is None:
                decoder = _tar_codec().decoder()
            data = decoder.decompress(resp.chunk.data)
            if data:
                yield data

    @rpc("SnapshotService/ImportArchive")
    async def import_archive(
        self,
        chunks: AsyncIterable[bytes],
        path: str = "",
        *,
        replace: bool = False,
        deadline: float | None = None,
        compression: str = "auto",
    ) -> ArchiveImported:
        """Unpack a tar streamed from `chunks` into the folder `path`; the server checks every
        member before anything lands. `replace` empties the folder first. Never retried: the
        chunks cannot be replayed. `compression` as for `export_archive`: the chunks are the
        plain tar either way, compressed here when zstd is used."""
        wire = await _archive_compression(self._client, compression, deadline)

        async def requests() -> AsyncIterator[snapshot_pb2.ImportArchiveRequest]:
            header = snapshot_pb2.ImportArchiveHeader(
                session_id=self.id, path=path, replace=replace, compression=wire
            )
            yield snapshot_pb2.ImportArchiveRequest(header=header)
            if wire == snapshot_pb2.ARCHIVE_COMPRESSION_UNSPECIFIED:
                async for data in chunks:
                    if data:
                        yield snapshot_pb2.ImportArchiveRequest(data=data)
                return
            encoder = _tar_codec().encoder()
            async for data in chunks:
                out = encoder.compress(data) if data else b""
                if out:
                    yield snapshot_pb2.ImportArchiveRequest(data=out)
            yield snapshot_pb2.ImportArchiveRequest(data=encoder.flush())

        ends = CallEnd()  # the server's refusal ends the upload: stop reading `chunks`
        resp = await self._client._unary(
            "SnapshotService/ImportArchive",
            lambda t: self._stubs.snapshots.ImportArchive(ends.until_ended(requests()), timeout=t),
            deadline,
            ends=ends,
        )
        return models.ArchiveImported(files=resp.files, bytes=resp.bytes)

    @rpc("SnapshotService/CreateSnapshot")
    async def snapshot(
        self,
        *,
        kind: str = "",
        labels: Mapping[str, str] | None = None,
        request_id: str = "",
        timeout: float | None = UNSET,
    ) -> SnapshotInfo:
        """Snapshot the workspace ("TAR", the default) or the whole container ("IMAGE").
        With a `request_id` the call is retried safely: a retry returns the first snapshot."""
        req = snapshot_pb2.CreateSnapshotRequest(
            session_id=self.id,
            labels=dict(labels or {}),
            kind=enum_value(snapshot_pb2.SnapshotKind, kind, "SNAPSHOT_KIND_"),
            request_id=request_id,
        )
        resp = await self._client._unary(
            "SnapshotService/CreateSnapshot",
            lambda t: self._stubs.snapshots.CreateSnapshot(req, timeout=t),
            timeout,
            idempotent=True if request_id else None,
        )
        return models.SnapshotInfo.from_pb(resp.snapshot)

    def snapshots(self, *, page_size: int = 0) -> AsyncIterator[SnapshotInfo]:
        """This session's snapshots (ListSnapshots)."""
        return self._client.list_snapshots(self.id, page_size=page_size)
