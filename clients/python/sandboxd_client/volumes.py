"""Volumes: VolumeService (CreateVolume, GetVolume, ListVolumes, DeleteVolume, ExportVolume,
ImportVolume), as a mixin of SandboxClient, with their typed results. A session mounts them at
create: `create_session(volumes=[VolumeMount("data", "/mnt/data")])`."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Self

from sandboxd_client._call_end import CallEnd
from sandboxd_client._convert import timestamp
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import UNSET, rpc

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import volumes_pb2, volumes_pb2_grpc
else:  # loaded on first use (sandboxd_client._lazy)
    volumes_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.volumes_pb2")
    volumes_pb2_grpc = lazy("sandboxd_client._gen.sandboxd.v1.volumes_pb2_grpc")


@dataclasses.dataclass(frozen=True)
class VolumeMount:
    """A volume in a session, at `path` below /mnt; read-write by one session at a time."""

    volume_id: str
    path: str
    read_only: bool = False

    def to_pb(self) -> volumes_pb2.VolumeMount:
        return volumes_pb2.VolumeMount(
            volume_id=self.volume_id, path=self.path, read_only=self.read_only
        )


@dataclasses.dataclass(frozen=True)
class Volume:
    volume_id: str
    size_bytes: int
    used_bytes: int
    labels: dict[str, str]
    created_at: dt.datetime | None
    attached: tuple[tuple[str, bool], ...]  # (session id, read-only) of the sessions mounting it

    @classmethod
    def from_pb(cls, m: volumes_pb2.Volume) -> Self:
        return cls(
            m.volume_id,
            m.size_bytes,
            m.used_bytes,
            dict(m.labels),
            timestamp(m, "created_at"),
            tuple((a.session_id, a.read_only) for a in m.attached),
        )


class VolumesMixin:
    """SandboxClient's volume calls."""

    channel: Any
    _server_stream: Callable[..., AsyncIterator[Any]]
    _unary: Callable[..., Awaitable[Any]]
    _paged: Callable[..., AsyncIterator[Any]]

    @property
    def _volumes(self) -> volumes_pb2_grpc.VolumeServiceStub:
        return volumes_pb2_grpc.VolumeServiceStub(self.channel)

    @rpc("VolumeService/CreateVolume")
    async def create_volume(
        self,
        volume_id: str = "",
        *,
        size_bytes: int = 0,
        labels: Mapping[str, str] | None = None,
        timeout: float | None = UNSET,
    ) -> Volume:
        """With a `volume_id` the call is idempotent (the same request returns the volume)."""
        req = volumes_pb2.CreateVolumeRequest(
            volume_id=volume_id, size_bytes=size_bytes, labels=dict(labels or {})
        )
        stub = self._volumes
        resp = await self._unary(
            "VolumeService/CreateVolume",
            lambda t: stub.CreateVolume(req, timeout=t),
            timeout,
            idempotent=bool(volume_id),
        )
        return Volume.from_pb(resp.volume)

    @rpc("VolumeService/GetVolume")
    async def get_volume(self, volume_id: str, *, timeout: float | None = UNSET) -> Volume:
        req = volumes_pb2.GetVolumeRequest(volume_id=volume_id)
        stub = self._volumes
        resp = await self._unary(
            "VolumeService/GetVolume", lambda t: stub.GetVolume(req, timeout=t), timeout
        )
        return Volume.from_pb(resp.volume)

    @rpc("VolumeService/ListVolumes")
    async def list_volumes(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        page_size: int = 0,
        timeout: float | None = UNSET,
    ) -> AsyncIterator[Volume]:
        """The caller's volumes by id (pages followed); `labels` selects."""
        stub = self._volumes
        async for page in self._paged(
            "VolumeService/ListVolumes",
            lambda token, t: stub.ListVolumes(
                volumes_pb2.ListVolumesRequest(
                    label_selector=dict(labels or {}), page_size=page_size, page_token=token
                ),
                timeout=t,
            ),
            timeout,
        ):
            for m in page.volumes:
                yield Volume.from_pb(m)

    @rpc("VolumeService/DeleteVolume")
    async def delete_volume(self, volume_id: str, *, timeout: float | None = UNSET) -> bool:
        """Whether it was there; refused (VOLUME_IN_USE) while a live session mounts it."""
        req = volumes_pb2.DeleteVolumeRequest(volume_id=volume_id)
        stub = self._volumes
        resp = await self._unary(
            "VolumeService/DeleteVolume", lambda t: stub.DeleteVolume(req, timeout=t), timeout
        )
        return bool(resp.existed)

    @rpc("VolumeService/ExportVolume")
    async def export_volume(
        self, volume_id: str, *, timeout: float | None = None
    ) -> AsyncIterator[bytes]:
        """The volume's content as a tar, in chunks as they come."""
        req = volumes_pb2.ExportVolumeRequest(volume_id=volume_id)
        stub = self._volumes
        async for resp in self._server_stream(lambda t: stub.ExportVolume(req, timeout=t), timeout):
            yield resp.data

    @rpc("VolumeService/ImportVolume")
    async def import_volume(
        self,
        volume_id: str,
        chunks: AsyncIterable[bytes],
        *,
        replace: bool = False,
        timeout: float | None = None,
    ) -> Volume:
        """Unpack a tar streamed from `chunks` into the volume, all or nothing (every member
        checked first); `replace` empties it first. Never retried: chunks cannot be replayed."""

        async def requests() -> AsyncIterator[volumes_pb2.ImportVolumeRequest]:
            header = volumes_pb2.ImportVolumeHeader(volume_id=volume_id, replace=replace)
            yield volumes_pb2.ImportVolumeRequest(header=header)
            async for data in chunks:
                if data:
                    yield volumes_pb2.ImportVolumeRequest(data=data)

        ends = CallEnd()  # the server's refusal ends the upload: stop reading `chunks`
        stub = self._volumes
        resp = await self._unary(
            "VolumeService/ImportVolume",
            lambda t: stub.ImportVolume(ends.until_ended(requests()), timeout=t),
            timeout,
            ends=ends,
        )
        return Volume.from_pb(resp.volume)


__all__ = ["Volume", "VolumeMount", "VolumesMixin"]
