"""Volume disks on Docker: the `VolumeDisks` port of sandboxd.volumes over the one disk
mechanism (sandboxd.storage.disks: sparse ext4 images on loop devices, kernel-enforced size,
mounted nosuid,nodev, made through the engine API, surviving engine restarts).

What volumes add: a disk is handed to the session that mounts it read-write (each session runs
as a host uid of its own, sandboxd.host_ids, and a volume outlives its writers), by a
short-lived container of the runtime image with only CAP_CHOWN, CAP_FOWNER and
CAP_DAC_READ_SEARCH, no network, a read-only root, runc, running `chown -R -h` (never through a
symlink) with two integers the server checked; and each sandbox's volume mounts are resolved
to the engine volume of the loop device the disk is on right before the sandbox is created.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
from typing import Any

import aiodocker

from sandboxd.engine.docker_errors import translate_errors
from sandboxd.engine.protocol import SandboxRequest
from sandboxd.errors import Internal
from sandboxd.labels import LABEL_OWNER
from sandboxd.storage import disk_tool
from sandboxd.storage.disks import Disks

log = logging.getLogger(__name__)

OWN_TIMEOUT_S = 600.0
LABEL_VOLUME_OWN = "io.sandboxd.volume-own"
# Runs as root with three capabilities; $1 and $2 are integers the server checked.
_OWN_SCRIPT = 'chmod 0755 /v && chown -R -h "$1:$2" /v'
# The filesystem of a volume needs room of its own (ext4's journal and tables).
MIN_VOLUME_BYTES = 16 * 1024 * 1024
# Whose the root of a new disk is until a session mounts it read-write: nobody's.
_NOBODY = 65534


async def with_volume_sources(disks: Disks, request: SandboxRequest) -> SandboxRequest:
    """The request with each volume's disk id replaced by the engine volume that mounts it now
    (attaching it again after a host restart): build it right before the container."""
    if not request.spec.volumes:
        return request
    mounts = [dataclasses.replace(v, disk=await disks.attach(v.disk)) for v in request.spec.volumes]
    spec = dataclasses.replace(request.spec, volumes=tuple(mounts))
    return dataclasses.replace(request, spec=spec)


def own_config(
    image: str, volume: str, uid: int, gid: int, labels: dict[str, str]
) -> dict[str, Any]:
    """The container that gives a new volume's files to its session's uid:gid, confined as the
    disk tool's own hand-over is (one config for both)."""
    return disk_tool.hand_over_config(
        image,
        _OWN_SCRIPT,
        volume,
        "/v",
        (uid, gid),
        env_path="/bin:/usr/bin",
        labels=labels,
        what="volume",
    )


class DockerVolumeDisks:
    """The disks of named volumes, on the engine's disk mechanism."""

    def __init__(
        self,
        docker: aiodocker.Docker,
        disks: Disks,
        *,
        owner_id: str,
        image: str,
        running: set[str] | None = None,
    ) -> None:
        self._docker = docker
        self._disks = disks
        # Its containers carry the porters' owner id (sandboxd.volumes.porting), which no
        # session's reconcile lists, and are in `running` (the porters' sweep skips those).
        self._owner_id = f"{owner_id}-porter"
        self._image = image  # the runtime image: has sh, chmod and chown
        self._running = running if running is not None else set()

    async def create_disk(self, name: str, size_bytes: int) -> None:
        await self._disks.create(name, max(size_bytes, MIN_VOLUME_BYTES), _NOBODY, _NOBODY)

    async def remove_disk(self, name: str) -> None:
        await self._disks.delete(name)

    async def disk_used_bytes(self, name: str) -> int:
        """What the disk's image takes on the engine host (sparse: its files and ext4's own
        few MiB), the figure the engine host's disk pays for the volume."""
        return (await self._disks.usage(name)).allocated_bytes

    async def list_disks(self, prefix: str) -> list[str]:
        return [i for i in await self._disks.list_ids() if i.startswith(prefix)]

    async def own_disk(self, name: str, uid: int, gid: int) -> None:
        """Every file of the disk owned by uid:gid, its root 0755 (readers read by mode)."""
        volume = await self._disks.attach(name)
        labels = {LABEL_OWNER: self._owner_id, LABEL_VOLUME_OWN: name}
        config = own_config(self._image, volume, uid, gid, labels)
        container_name = f"sandboxd-own-{self._owner_id}-{secrets.token_hex(6)}"
        with translate_errors(f"handing volume disk {name} to {uid}:{gid}"):
            container = await self._docker.containers.create(config, name=container_name)
            self._running.add(container.id)
            try:
                await container.start()
                status = await asyncio.wait_for(container.wait(), OWN_TIMEOUT_S)
                code = int((status or {}).get("StatusCode", -1))
                if code != 0:
                    said = "".join(await container.log(stdout=True, stderr=True))[-300:]
                    raise Internal(f"handing volume disk {name} over failed ({code}): {said}")
            finally:
                with contextlib.suppress(aiodocker.DockerError):
                    await asyncio.shield(container.delete(force=True))
                self._running.discard(container.id)
