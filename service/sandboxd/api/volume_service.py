"""VolumeService: proto <-> sandboxd.volumes (no logic of its own)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from sandboxd.api import replies
from sandboxd.api.errors import Ctx, stream, unary
from sandboxd.api.limits import idle_limited
from sandboxd.errors import InvalidArgument
from sandboxd.models import VolumeMount
from sandboxd.reasons import Reason
from sandboxd.v1 import volumes_pb2, volumes_pb2_grpc
from sandboxd.volumes.service import Volume, Volumes


def volume_pb(v: Volume) -> volumes_pb2.Volume:
    r = v.record
    pb = volumes_pb2.Volume(
        volume_id=r.volume_id,
        size_bytes=r.size_bytes,
        used_bytes=v.used_bytes,
        labels=r.labels,
        attached=[volumes_pb2.VolumeAttachment(session_id=s, read_only=ro) for s, ro in v.attached],
    )
    pb.created_at.FromDatetime(r.created_at)
    return pb


def mount_pb(m: VolumeMount) -> volumes_pb2.VolumeMount:
    """A session's mount as the API echoes it (the disk is the server's own name)."""
    return volumes_pb2.VolumeMount(volume_id=m.volume_id, path=m.path, read_only=m.read_only)


def mount_from_pb(m: volumes_pb2.VolumeMount) -> VolumeMount:
    return VolumeMount(volume_id=m.volume_id, path=m.path, read_only=m.read_only)


async def _data(requests: AsyncIterator[volumes_pb2.ImportVolumeRequest]) -> AsyncIterator[bytes]:
    async for req in requests:
        if req.WhichOneof("payload") != "data":
            raise InvalidArgument(
                "ImportVolume: only the first message may carry a header",
                reason=Reason.ARCHIVE_HEADER_INVALID,
            )
        data = req.data  # each read of a bytes field is a copy: read it once
        if data:
            yield data


class VolumeService(volumes_pb2_grpc.VolumeServiceServicer):
    def __init__(self, volumes: Volumes, idle_s: float) -> None:
        self._volumes = volumes
        self._idle_s = idle_s  # a stalled upload must not hold the volume's lock

    @unary
    async def CreateVolume(
        self, request: volumes_pb2.CreateVolumeRequest, context: Ctx
    ) -> volumes_pb2.CreateVolumeResponse:
        v = await self._volumes.create(request.volume_id, request.size_bytes, dict(request.labels))
        return volumes_pb2.CreateVolumeResponse(volume=volume_pb(v))

    @unary
    async def GetVolume(
        self, request: volumes_pb2.GetVolumeRequest, context: Ctx
    ) -> volumes_pb2.GetVolumeResponse:
        return volumes_pb2.GetVolumeResponse(
            volume=volume_pb(await self._volumes.get(request.volume_id))
        )

    @unary
    async def ListVolumes(
        self, request: volumes_pb2.ListVolumesRequest, context: Ctx
    ) -> volumes_pb2.ListVolumesResponse:
        async def page(size: int) -> volumes_pb2.ListVolumesResponse:
            found, token = await self._volumes.list(
                dict(request.label_selector), size, request.page_token
            )
            return volumes_pb2.ListVolumesResponse(
                volumes=[volume_pb(v) for v in found], next_page_token=token
            )

        return await replies.fitted_page(page, "volumes", request.page_size)

    @unary
    async def DeleteVolume(
        self, request: volumes_pb2.DeleteVolumeRequest, context: Ctx
    ) -> volumes_pb2.DeleteVolumeResponse:
        return volumes_pb2.DeleteVolumeResponse(
            existed=await self._volumes.delete(request.volume_id)
        )

    @stream
    async def ExportVolume(
        self, request: volumes_pb2.ExportVolumeRequest, context: Ctx
    ) -> AsyncGenerator[volumes_pb2.ExportVolumeResponse, None]:
        async for data in self._volumes.export(request.volume_id):
            yield volumes_pb2.ExportVolumeResponse(data=data)

    @unary
    async def ImportVolume(
        self, request: AsyncIterator[volumes_pb2.ImportVolumeRequest], context: Ctx
    ) -> volumes_pb2.ImportVolumeResponse:
        requests = aiter(idle_limited(request, self._idle_s))
        first = await anext(requests, None)
        if first is None or first.WhichOneof("payload") != "header":
            raise InvalidArgument(
                "ImportVolume: the first message must carry the header",
                reason=Reason.ARCHIVE_HEADER_INVALID,
            )
        header = first.header
        v = await self._volumes.import_(header.volume_id, header.replace, _data(requests))
        return volumes_pb2.ImportVolumeResponse(volume=volume_pb(v))
