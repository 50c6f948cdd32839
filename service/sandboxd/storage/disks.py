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

`Disks` is the interface the domain uses (workspaces, named volumes), reached as
`Engine.disks`; `storage/docker_disks.py` is the engine's implementation, `tests/fakes.py` has
the in-memory one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


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


WORKSPACE_FLAGS = MountFlags()  # a workspace keeps exec, as its tmpfs did


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

    async def attach(self, disk_id: str, flags: MountFlags = WORKSPACE_FLAGS) -> str:
        """The engine volume that mounts the disk now (attaching it again after a host
        restart); NotFound ENGINE_OBJECT_NOT_FOUND when there is no such disk. Call it right
        before creating a container that mounts it."""
        ...

    def mount(self, volume: str, target: str, *, read_only: bool = False) -> DiskMount: ...

    async def exists(self, disk_id: str) -> bool:
        """Whether this owner has the disk (one volume inspect: no tool container)."""
        ...

    async def usage(self, disk_id: str) -> DiskUsage:
        """NotFound (ENGINE_OBJECT_NOT_FOUND) when there is no such disk."""
        ...

    async def copy(
        self, source_id: str, disk_id: str, uid: int = 0, gid: int = 0, *, freeze: str = ""
    ) -> DiskUsage:
        """A sparse copy made on the engine host (no byte through the server), every file of
        it given to uid:gid (its root 0700: the host id of whoever mounts it next) and
        attached; uid 0: kept as it is and not attached (a snapshot's copy, which nobody
        mounts: a loop device each would run the host out of them).
        `freeze`: the container that mounts the source, paused for the copy (after the
        kernel's dirty pages are written out), so the copy is one instant of its files; a
        source no container mounts needs none. Idempotent by `disk_id`. Refused with
        ResourceExhausted ENGINE_DISK_FULL when the engine host has less free space than the
        source takes; refused or failed, nothing of the copy is left behind."""
        ...

    async def delete(self, disk_id: str) -> bool:
        """Detach and remove it with its mount volumes; False when there was none. A disk a
        container still mounts is FailedPrecondition ENGINE_CONFLICT (remove it first)."""
        ...

    async def reap(self) -> list[str]:
        """Detach every loop device of the engine host a disk image removed while attached
        left (the kernel keeps its blocks until then; a mounted one goes when unmounted), of
        any owner: such a loop holds a file nobody can reach again. The loops it detached;
        FailedPrecondition DISK_STORAGE_UNAVAILABLE when the engine cannot run the tool."""
        ...

    async def list_ids(self) -> list[str]:
        """The ids of this owner's disks (the sweep's view)."""
        ...
