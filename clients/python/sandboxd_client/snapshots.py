"""Snapshots not bound to a live session (SnapshotService: GetSnapshot, ListSnapshots,
DeleteSnapshot, DownloadSnapshot), as a mixin of SandboxClient; a live session's own
(CreateSnapshot, ExportArchive, ImportArchive) are Session's (session_archives.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import UNSET, rpc

if TYPE_CHECKING:
    from sandboxd_client import models
    from sandboxd_client._gen.sandboxd.v1 import snapshot_pb2
    from sandboxd_client.models import SnapshotInfo
else:  # loaded on first use (sandboxd_client._lazy)
    models = lazy("sandboxd_client.models")
    snapshot_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.snapshot_pb2")


class SnapshotsMixin:
    """SandboxClient's snapshot calls; the host class provides `stubs`, `_unary`,
    `_server_stream` and `_paged`."""

    stubs: Any
    _unary: Callable[..., Awaitable[Any]]
    _server_stream: Callable[..., AsyncIterator[Any]]
    _paged: Callable[..., AsyncIterator[Any]]

    @rpc("SnapshotService/GetSnapshot")
    async def get_snapshot(
        self, snapshot_id: str, *, timeout: float | None = UNSET
    ) -> SnapshotInfo:
        req = snapshot_pb2.GetSnapshotRequest(snapshot_id=snapshot_id)
        resp = await self._unary(
            "SnapshotService/GetSnapshot",
            lambda t: self.stubs.snapshots.GetSnapshot(req, timeout=t),
            timeout,
        )
        return models.SnapshotInfo.from_pb(resp.snapshot)

    @rpc("SnapshotService/ListSnapshots")
    async def list_snapshots(
        self,
        session_id: str = "",
        *,
        labels: Mapping[str, str] | None = None,
        page_size: int = 0,
        timeout: float | None = UNSET,
    ) -> AsyncIterator[SnapshotInfo]:
        """Snapshots of one session (or every session of the caller's) carrying all of
        `labels`, page by page."""

        async for resp in self._paged(
            "SnapshotService/ListSnapshots",
            lambda token, t: self.stubs.snapshots.ListSnapshots(
                snapshot_pb2.ListSnapshotsRequest(
                    session_id=session_id,
                    page_size=page_size,
                    page_token=token,
                    label_selector=dict(labels or {}),
                ),
                timeout=t,
            ),
            timeout,
        ):
            for snap in resp.snapshots:
                yield models.SnapshotInfo.from_pb(snap)

    @rpc("SnapshotService/DeleteSnapshot")
    async def delete_snapshot(self, snapshot_id: str, *, timeout: float | None = UNSET) -> None:
        req = snapshot_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id)
        await self._unary(
            "SnapshotService/DeleteSnapshot",
            lambda t: self.stubs.snapshots.DeleteSnapshot(req, timeout=t),
            timeout,
        )

    @rpc("SnapshotService/DownloadSnapshot")
    async def download_snapshot(
        self, snapshot_id: str, *, timeout: float | None = None
    ) -> AsyncIterator[bytes]:
        """The snapshot's tar, in chunks as they arrive."""
        req = snapshot_pb2.DownloadSnapshotRequest(snapshot_id=snapshot_id)
        async for resp in self._server_stream(
            lambda t: self.stubs.snapshots.DownloadSnapshot(req, timeout=t), timeout
        ):
            yield resp.chunk.data
