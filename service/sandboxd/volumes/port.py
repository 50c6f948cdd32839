"""The disk mechanism as the volume domain asks for it: a small typed port.

The engine side (disks that are sparse, size-limited by the kernel, formatted, created through
the engine's API and mounted into a sandbox with nosuid, nodev) is the same one disk-backed
workspaces use; the unit layer runs the domain over a fake of this port (tests/unit). A disk's
name is the server's (never a volume id: ids are the caller's, and tenants share the engine).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

# Every volume's disk id is this prefix and a random part (the disk mechanism scopes ids to the
# server's owner id): the sweep knows a volume's disk by its id, and never takes one a volume
# record holds, nor another kind of disk (a session's workspace).
DISK_PREFIX = "vol-"


class VolumeDisks(Protocol):
    async def create_disk(self, name: str, size_bytes: int) -> None:
        """A new empty disk of `size_bytes` (a write past it is ENOSPC). Nothing is left
        behind when this raises (a host without room is RESOURCE_EXHAUSTED)."""

    async def remove_disk(self, name: str) -> None:
        """Remove the disk and its content; a missing one is not an error."""

    async def disk_used_bytes(self, name: str) -> int:
        """Bytes its files take now (0 when the engine cannot say)."""

    async def list_disks(self, prefix: str) -> list[str]:
        """Names of the disks whose name starts with `prefix` (the sweep's view)."""

    async def own_disk(self, name: str, uid: int, gid: int) -> None:
        """Every file of the disk owned by uid:gid (the host uid of the session that mounts it
        read-write: each session runs as its own), its root mode 0755."""


class VolumePorter(Protocol):
    """A volume's content in and out as tar streams, through the server's one tar transfer
    (sandboxd.archive.transfer) in a short-lived sandbox that mounts the disk."""

    def export(self, disk: str, size_bytes: int) -> AsyncIterator[bytes]:
        """The disk's tar in chunks (read-only mount)."""

    async def import_(
        self, disk: str, size_bytes: int, replace: bool, chunks: AsyncIterator[bytes]
    ) -> None:
        """Checked and merged all or nothing, as ImportArchive; the disk as it was on refusal."""

    async def sweep(self) -> int:
        """Remove what a dead server's transfers left; how many."""
