"""Disks: sparse, kernel-enforced ext4 filesystems a sandbox mounts (disk workspaces, volumes).

A disk is a sparse file (`disk.img`) holding an ext4 filesystem of exactly `size_bytes`, in an
engine volume of its own (`sandboxd-disk-<id>`), attached to a loop device of the engine host.
A container mounts it through a Docker `local` volume of type ext4 on that loop device
(`sandboxd-diskmnt-<id>-<loop>-<flags>`), which the engine mounts when the container starts and
unmounts when the last container using it stops. Everything goes through the engine API (the
remote engine shares no path with the server), works under gVisor (its gofer serves the
engine's mount), and the quota is the filesystem's size: a write past it is ENOSPC inside the
sandbox, whatever else the host holds. docs/workspaces.md has the measurements behind it.

Loop devices do not survive a host restart and their numbers are handed out again: so the
mount volume names its loop, and `attach` (run before every container that mounts a disk is
created) attaches the image again when it is not and gives the mount volume of the loop it is
on now, removing those of other loops no container uses.

`Disks` is the interface the domain uses (workspaces, named volumes); `DockerDisks` is the
one implementation; `tests/fakes.py` has the in-memory one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiodocker

from sandboxd.errors import FailedPrecondition, Internal, NotFound, ResourceExhausted
from sandboxd.labels import LABEL_OWNER
from sandboxd.reasons import Reason
from sandboxd.storage import disk_tool
from sandboxd.storage.disk_tool import (
    DISK_IMAGE_PREFIX,
    DISK_MOUNT_PREFIX,
    LABEL_DISK,
    LABEL_DISK_SIZE,
    LABEL_DISK_TOOL,
    checked_id,
    checked_size,
)

TOOL_TIMEOUT_S = 120.0  # a copy of a large disk reads all of its allocated bytes


@dataclass(frozen=True)
class DiskUsage:
    """`size_bytes`: the filesystem's size (the quota); `allocated_bytes`: what its image
    takes on the engine host now (sparse: a few MiB when empty, grows with what is written)."""

    disk_id: str
    size_bytes: int
    allocated_bytes: int


@dataclass(frozen=True)
class DiskMount:
    """A disk as one container mounts it: the engine volume and where, with its flags.

    `volume` comes from `Disks.attach` (it names the loop device the disk is on now): build
    the mount only right before the container is created."""

    volume: str
    target: str
    read_only: bool = False

    def engine_mount(self) -> dict[str, Any]:
        """The Docker `HostConfig.Mounts` entry. NoCopy: the engine must not copy the image's
        folder at `target` (its files, owner and mode) into the disk."""
        return {
            "Type": "volume",
            "Source": self.volume,
            "Target": self.target,
            "ReadOnly": self.read_only,
            "VolumeOptions": {"NoCopy": True},
        }


@dataclass(frozen=True)
class MountFlags:
    """The mount options of the filesystem itself (nosuid and nodev always: a disk is the
    tenant's bytes); `noexec` for data that should never run (a workspace keeps exec)."""

    noexec: bool = False

    def options(self) -> str:
        return "nosuid,nodev,noexec" if self.noexec else "nosuid,nodev"

    def tag(self) -> str:
        return "nx" if self.noexec else "x"


class Disks(Protocol):
    """Disks of this server's owner id. Ids are the server's own (`disk_tool.DISK_ID`), never
    a tenant's text: a tenant-facing name maps to one elsewhere."""

    async def create(self, disk_id: str, size_bytes: int, uid: int, gid: int) -> DiskUsage:
        """Make it (sparse, formatted, its root owned by uid:gid, mode 0700) and attach it.
        Idempotent by id: an existing disk of the same size is returned as it is (never
        formatted again); another size is FailedPrecondition ENGINE_CONFLICT. Refused with
        ResourceExhausted ENGINE_DISK_FULL when the engine host has less free space than
        `size_bytes`, FailedPrecondition DISK_STORAGE_UNAVAILABLE when the engine cannot make
        disks; either way nothing is left behind."""
        ...

    async def attach(self, disk_id: str, flags: MountFlags = MountFlags()) -> str:
        """The engine volume that mounts the disk now (attaching it again after a host restart);
        NotFound DISK... when there is no such disk. Call it right before creating a container."""
        ...

    def mount(self, volume: str, target: str, *, read_only: bool = False) -> DiskMount: ...

    async def usage(self, disk_id: str) -> DiskUsage:
        """NotFound (ENGINE_OBJECT_NOT_FOUND) when there is no such disk."""
        ...

    async def copy(self, source_id: str, disk_id: str) -> DiskUsage:
        """A sparse copy made on the engine host (no byte through the server), attached. The
        source must not be mounted by a running container (its filesystem would be copied
        mid-write); idempotent by `disk_id`."""
        ...

    async def delete(self, disk_id: str) -> bool:
        """Detach and remove it with its mount volumes; False when there was none. A disk a
        container still mounts is FailedPrecondition ENGINE_CONFLICT (remove it first)."""
        ...

    async def list_ids(self) -> list[str]:
        """The ids of this owner's disks (the sweep's view)."""
        ...


Translate = Callable[[str], contextlib.AbstractContextManager[None]]


class DockerDisks:
    """`Disks` on the Docker Engine API: the tool container does what needs loop devices."""

    def __init__(
        self,
        docker: Callable[[], aiodocker.Docker],
        translate: Translate,
        *,
        owner_id: str,
        tool_image: str,
    ) -> None:
        self._docker = docker
        self._translate = translate
        self._owner = owner_id
        self._image = tool_image
        self._locks: dict[str, asyncio.Lock] = {}

    # ----- names --------------------------------------------------------------------------

    @staticmethod
    def image_volume(disk_id: str) -> str:
        return DISK_IMAGE_PREFIX + checked_id(disk_id)

    @staticmethod
    def mount_volume(disk_id: str, device: str, flags: MountFlags) -> str:
        loop = device.removeprefix("/dev/")
        return f"{DISK_MOUNT_PREFIX}{checked_id(disk_id)}-{loop}-{flags.tag()}"

    def _labels(self, disk_id: str, **more: str) -> dict[str, str]:
        return {LABEL_OWNER: self._owner, LABEL_DISK: disk_id, **more}

    def _lock(self, disk_id: str) -> asyncio.Lock:
        return self._locks.setdefault(disk_id, asyncio.Lock())

    # ----- the interface ------------------------------------------------------------------

    async def create(self, disk_id: str, size_bytes: int, uid: int, gid: int) -> DiskUsage:
        checked_size(size_bytes)
        volume = self.image_volume(disk_id)
        async with self._lock(disk_id):
            existing = await self._volume(volume)
            if existing is not None:
                have = int((existing.get("Labels") or {}).get(LABEL_DISK_SIZE, "0") or 0)
                if have != size_bytes:
                    raise FailedPrecondition(
                        f"disk {disk_id} exists with {have} bytes, not {size_bytes}",
                        reason=Reason.ENGINE_CONFLICT,
                    )
            else:
                await self._ensure_tool_image()
                with self._translate(f"creating volume {volume}"):
                    await self._docker().volumes.create(  # type: ignore[no-untyped-call]
                        {
                            "Name": volume,
                            "Labels": self._labels(disk_id, **{LABEL_DISK_SIZE: str(size_bytes)}),
                        }
                    )
            try:
                result = await self._run(disk_id, "create", (size_bytes, uid, gid))
            except BaseException:
                if existing is None:  # nothing half-made: a refused or failed create
                    await asyncio.shield(self._remove_volume(volume))
                raise
            return DiskUsage(disk_id, result.size_bytes, result.allocated_bytes)

    async def attach(self, disk_id: str, flags: MountFlags = MountFlags()) -> str:
        async with self._lock(disk_id):
            await self._require(disk_id)
            result = await self._run(disk_id, "attach", ())
            name = self.mount_volume(disk_id, result.device, flags)
            if await self._volume(name) is None:
                with self._translate(f"creating volume {name}"):
                    await self._docker().volumes.create(  # type: ignore[no-untyped-call]
                        {
                            "Name": name,
                            "Driver": "local",
                            "DriverOpts": {
                                "type": "ext4",
                                "device": result.device,
                                "o": flags.options(),
                            },
                            "Labels": self._labels(disk_id),
                        }
                    )
            # Mount volumes of loops this disk is no longer on: a restarted host hands their
            # numbers to other disks. One a container still uses stays (the engine refuses).
            current = self.mount_volume(disk_id, result.device, MountFlags()).removesuffix("x")
            for other in await self._mount_volumes(disk_id):
                if not other.startswith(current):
                    await self._remove_volume(other, quiet=True)
            return name

    def mount(self, volume: str, target: str, *, read_only: bool = False) -> DiskMount:
        return DiskMount(volume=volume, target=target, read_only=read_only)

    async def usage(self, disk_id: str) -> DiskUsage:
        await self._require(disk_id)
        result = await self._run(disk_id, "usage", ())
        return DiskUsage(disk_id, result.size_bytes, result.allocated_bytes)

    async def copy(self, source_id: str, disk_id: str) -> DiskUsage:
        source = await self._require(source_id)
        size = (source.get("Labels") or {}).get(LABEL_DISK_SIZE, "0")
        volume = self.image_volume(disk_id)
        async with self._lock(disk_id):
            made = await self._volume(volume) is None
            if made:
                with self._translate(f"creating volume {volume}"):
                    await self._docker().volumes.create(  # type: ignore[no-untyped-call]
                        {"Name": volume, "Labels": self._labels(disk_id, **{LABEL_DISK_SIZE: size})}
                    )
            try:
                await self._run(disk_id, "copy", (), source_volume=self.image_volume(source_id))
                result = await self._run(disk_id, "attach", ())
            except BaseException:
                if made:
                    await asyncio.shield(self._remove_volume(volume))
                raise
            return DiskUsage(disk_id, result.size_bytes, result.allocated_bytes)

    async def delete(self, disk_id: str) -> bool:
        volume = self.image_volume(disk_id)
        async with self._lock(disk_id):
            mounts = await self._mount_volumes(disk_id)
            for name in mounts:
                await self._remove_volume(name)  # in use: ENGINE_CONFLICT, nothing detached
            if await self._volume(volume) is None:
                return bool(mounts)
            await self._run(disk_id, "detach", ())
            await self._remove_volume(volume)
            self._locks.pop(disk_id, None)
            return True

    async def list_ids(self) -> list[str]:
        filters = {"label": [f"{LABEL_OWNER}={self._owner}", LABEL_DISK]}
        with self._translate("listing volumes"):
            found = await self._docker().volumes.list(filters=filters)  # type: ignore[no-untyped-call]
        ids = set()
        for v in found.get("Volumes") or []:
            name = str(v.get("Name", ""))
            if name.startswith(DISK_IMAGE_PREFIX):
                ids.add(name[len(DISK_IMAGE_PREFIX) :])
        return sorted(ids)

    # ----- engine steps -------------------------------------------------------------------

    async def _volume(self, name: str) -> dict[str, Any] | None:
        try:
            with self._translate(f"inspecting volume {name}"):
                volume = await self._docker().volumes.get(name)  # type: ignore[no-untyped-call]
                return dict(await volume.show())
        except NotFound:
            return None

    async def _require(self, disk_id: str) -> dict[str, Any]:
        found = await self._volume(self.image_volume(disk_id))
        labels = (found or {}).get("Labels") or {}
        if found is None or labels.get(LABEL_OWNER) != self._owner:
            raise NotFound(f"disk {disk_id} not found", reason=Reason.ENGINE_OBJECT_NOT_FOUND)
        return found

    async def _mount_volumes(self, disk_id: str) -> list[str]:
        filters = {"label": [f"{LABEL_OWNER}={self._owner}", f"{LABEL_DISK}={disk_id}"]}
        with self._translate("listing volumes"):
            found = await self._docker().volumes.list(filters=filters)  # type: ignore[no-untyped-call]
        prefix = f"{DISK_MOUNT_PREFIX}{disk_id}-"
        return sorted(
            str(v["Name"]) for v in found.get("Volumes") or [] if str(v["Name"]).startswith(prefix)
        )

    async def _remove_volume(self, name: str, *, quiet: bool = False) -> None:
        try:
            with self._translate(f"removing volume {name}"):
                await aiodocker.volumes.DockerVolume(self._docker(), name).delete()  # type: ignore[no-untyped-call]
        except NotFound:
            pass
        except FailedPrecondition:
            if not quiet:
                raise

    async def _ensure_tool_image(self) -> None:
        try:
            with self._translate(f"inspecting image {self._image}"):
                await self._docker().images.inspect(self._image)
        except NotFound:
            raise FailedPrecondition(
                f"disk workspaces need the disk tool image {self._image} on the engine "
                "(make disk-image builds it)",
                reason=Reason.DISK_STORAGE_UNAVAILABLE,
            ) from None

    async def _run(
        self, disk_id: str, op: str, numbers: tuple[int, ...], *, source_volume: str = ""
    ) -> disk_tool.ToolResult:
        """One run of the tool container: created, started, waited for, read, removed."""
        config = disk_tool.tool_config(
            self._image,
            op,
            numbers,
            disk_volume=self.image_volume(disk_id),
            labels=self._labels(disk_id, **{LABEL_DISK_TOOL: op}),
            source_volume=source_volume,
        )
        docker = self._docker()
        try:
            with self._translate(f"creating the disk tool for {disk_id}"):
                container = await docker.containers.create(config)
        except NotFound:
            await self._ensure_tool_image()
            raise
        try:
            with self._translate(f"running the disk tool for {disk_id}"):
                await container.start()
                async with asyncio.timeout(TOOL_TIMEOUT_S):
                    status = await container.wait()
                lines = await container.log(stdout=True, stderr=True)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(container.delete(force=True))
        output = "".join(lines)
        code = int(status.get("StatusCode", -1))
        if code == disk_tool.EXIT_NO_ROOM:
            result = disk_tool.parse_result(output)
            raise ResourceExhausted(
                f"the engine host has {result.available_bytes} bytes free, less than the disk "
                f"{disk_id} would take when full",
                reason=Reason.ENGINE_DISK_FULL,
                metadata={"available_bytes": str(result.available_bytes)},
            )
        if code == 4:
            raise FailedPrecondition(
                f"the engine gives no loop device for disk {disk_id}: {output.strip()[-300:]}",
                reason=Reason.DISK_STORAGE_UNAVAILABLE,
            )
        if code != 0:
            raise Internal(
                f"the disk tool ({op} {disk_id}) failed ({code}): {output.strip()[-400:]}"
            )
        return disk_tool.parse_result(output)
