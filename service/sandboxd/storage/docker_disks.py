"""`Disks` on the Docker Engine API (storage/disks.py says what a disk is).

The tool container (storage/disk_tool.py) does what needs loop devices; the rest is volumes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiodocker

from sandboxd.errors import (
    FailedPrecondition,
    Internal,
    NotFound,
    ResourceExhausted,
    SandboxError,
)
from sandboxd.labels import LABEL_OWNER, LABEL_WORK, LABEL_WORK_RUN, WORK_DISK_TOOL
from sandboxd.reasons import Reason
from sandboxd.storage import disk_tool
from sandboxd.storage.disk_tool import (
    DISK_IMAGE_PREFIX,
    DISK_MOUNT_PREFIX,
    DISK_REAP_PREFIX,
    LABEL_DISK,
    LABEL_DISK_SIZE,
    LABEL_DISK_TOOL,
    checked_id,
    checked_size,
)
from sandboxd.storage.disks import WORKSPACE_FLAGS, DiskMount, DiskUsage, MountFlags

TOOL_TIMEOUT_S = 120.0  # a copy of a large disk reads all of its allocated bytes


Translate = Callable[[str], contextlib.AbstractContextManager[None]]


@dataclass
class _DiskLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # holding or waiting


class DockerDisks:
    """`Disks` on the Docker Engine API: the tool container does what needs loop devices."""

    def __init__(
        self,
        docker: Callable[[], aiodocker.Docker],
        translate: Translate,
        *,
        owner_id: str,
        tool_image: str,
        run_id: str = "",
    ) -> None:
        self._docker = docker
        self._translate = translate
        self._owner = owner_id
        self._run_id = run_id  # on each tool run (engine/work_containers.py)
        self._image = tool_image
        self._locks: dict[str, _DiskLock] = {}

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

    @contextlib.asynccontextmanager
    async def _lock(self, disk_id: str) -> AsyncIterator[None]:
        """The disk's lock: one tool run at a time per disk (an attach between a delete's
        detach and its image's removal would leave a loop on the removed file). Dropped when
        its last holder or waiter leaves, never while one waits: a new caller then would get
        a lock of its own and run beside the waiter."""
        held = self._locks.setdefault(disk_id, _DiskLock())
        held.users += 1
        try:
            async with held.lock:
                yield
        finally:
            held.users -= 1
            if held.users == 0 and self._locks.get(disk_id) is held:
                del self._locks[disk_id]

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
            except BaseException as exc:
                if existing is None:  # nothing half-made: a refused or failed create
                    # Refused for room or for loop devices: nothing was attached.
                    refused = isinstance(exc, ResourceExhausted | FailedPrecondition)
                    await asyncio.shield(self._discard(disk_id, attached=not refused))
                raise
            return DiskUsage(disk_id, result.size_bytes, result.allocated_bytes)

    async def attach(self, disk_id: str, flags: MountFlags = WORKSPACE_FLAGS) -> str:
        async with self._lock(disk_id):
            await self._require(disk_id)
            return await self._attach(disk_id, flags)

    async def _attach(self, disk_id: str, flags: MountFlags) -> str:
        """Under the disk's lock: attached, and the mount volume of the loop it is on now."""
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

    async def exists(self, disk_id: str) -> bool:
        found = await self._volume(self.image_volume(disk_id))
        return found is not None and (found.get("Labels") or {}).get(LABEL_OWNER) == self._owner

    async def usage(self, disk_id: str) -> DiskUsage:
        await self._require(disk_id)
        result = await self._run(disk_id, "usage", ())
        return DiskUsage(disk_id, result.size_bytes, result.allocated_bytes)

    async def copy(
        self, source_id: str, disk_id: str, uid: int = 0, gid: int = 0, *, freeze: str = ""
    ) -> DiskUsage:
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
                async with self._frozen(freeze):
                    result = await self._run(
                        disk_id, "copy", (), source_volume=self.image_volume(source_id)
                    )
                if uid:  # to be mounted: attached and handed over
                    mount = await self._attach(disk_id, WORKSPACE_FLAGS)
                    await self._own(disk_id, mount, uid, gid)
            except BaseException as exc:
                if made:
                    # Refused for room: the script stopped before it made anything to attach.
                    refused = isinstance(exc, ResourceExhausted)
                    await asyncio.shield(self._discard(disk_id, attached=not refused))
                raise
            return DiskUsage(disk_id, result.size_bytes, result.allocated_bytes)

    @contextlib.asynccontextmanager
    async def _frozen(self, container_id: str) -> AsyncIterator[None]:
        """The container paused (its processes frozen: no write lands mid-copy) for the block,
        and let go whatever happens to it; none: nothing to freeze."""
        if not container_id:
            yield
            return
        container = aiodocker.containers.DockerContainer(self._docker(), id=container_id)
        with self._translate(f"pausing container {container_id[:12]} for a disk copy"):
            await container.pause()
        try:
            yield
        finally:
            with self._translate(f"unpausing container {container_id[:12]}"):
                await asyncio.shield(container.unpause())

    async def _own(self, disk_id: str, mount: str, uid: int, gid: int) -> None:
        """Every file of the disk given to uid:gid, its root 0700 (disk_tool.OWN_SCRIPT)."""
        config = disk_tool.own_config(
            self._image, mount, uid, gid, self._labels(disk_id, **{LABEL_DISK_TOOL: "own"})
        )
        code, output = await self._contained(disk_id, config)
        if code != 0:
            said = output.strip()[-300:]
            raise Internal(f"handing the disk {disk_id} to {uid}:{gid} failed ({code}): {said}")

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
            return True

    async def reap(self) -> list[str]:
        """Detach the loops whose disk image is gone (disk_tool.SCRIPT, `reap`), in a tool
        container mounting a scratch volume of this owner's (never a disk's: the label of
        disks is not on it), removed after."""
        await self._ensure_tool_image()
        scratch = DISK_REAP_PREFIX + self._owner
        labels = {LABEL_OWNER: self._owner, LABEL_DISK_TOOL: "reap"}
        with self._translate(f"creating volume {scratch}"):
            await self._docker().volumes.create({"Name": scratch, "Labels": labels})  # type: ignore[no-untyped-call]
        try:
            config = disk_tool.tool_config(
                self._image, "reap", (), disk_volume=scratch, labels=labels
            )
            code, output = await self._contained("reap", config)
        finally:
            with contextlib.suppress(SandboxError):
                await asyncio.shield(self._remove_volume(scratch))
        if code != 0:
            raise Internal(f"the disk tool (reap) failed ({code}): {output.strip()[-400:]}")
        return disk_tool.parse_reaped(output)

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

    async def _discard(self, disk_id: str, *, attached: bool = True) -> None:
        """What a failed create or copy made goes: detached first when the run may have
        attached the image before it failed (a loop on a removed file would keep its space),
        then the volume. A detach that fails keeps the volume, for the sweep's delete."""
        if attached:
            try:
                for name in await self._mount_volumes(disk_id):  # a copy's, made to own it
                    await self._remove_volume(name)
                await self._run(disk_id, "detach", ())
            except SandboxError:
                return
        with contextlib.suppress(SandboxError):
            await self._remove_volume(self.image_volume(disk_id))

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

    async def _contained(self, disk_id: str, config: dict[str, Any]) -> tuple[int, str]:
        """One run of a tool container: created, started, waited for, read, removed. Each
        carries this process's run id, so the next start removes one a dead server left
        (engine/work_containers.py)."""
        config = {
            **config,
            "Labels": {
                **(config.get("Labels") or {}),
                LABEL_OWNER: self._owner,
                LABEL_WORK: WORK_DISK_TOOL,
                LABEL_WORK_RUN: self._run_id,
            },
        }
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
        return int(status.get("StatusCode", -1)), "".join(lines)

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
        code, output = await self._contained(disk_id, config)
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
