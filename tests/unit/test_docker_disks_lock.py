"""The per-disk lock of `DockerDisks` (storage/docker_disks.py): no two tool runs of one disk
at once, also across a delete. An attach that ran between a delete's detach and its image
volume's removal would leave a loop device attached to the removed image (its blocks held
until the host restarts)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from sandboxd.labels import LABEL_OWNER
from sandboxd.storage import disk_tool
from sandboxd.storage.docker_disks import DockerDisks


@contextlib.contextmanager
def _translate(what: str) -> Iterator[None]:
    yield


class _Disks(DockerDisks):
    """Tool runs recorded as (op, start) .. (op, end) with a pause between: the engine steps
    around them answer at once."""

    def __init__(self) -> None:
        super().__init__(lambda: None, _translate, owner_id="o", tool_image="t")  # type: ignore[arg-type,return-value]
        self.running: set[str] = set()
        self.overlaps: list[tuple[str, str]] = []

    async def _volume(self, name: str) -> dict[str, Any] | None:
        return {"Labels": {LABEL_OWNER: "o"}}

    async def _mount_volumes(self, disk_id: str) -> list[str]:
        return []

    async def _remove_volume(self, name: str, *, quiet: bool = False) -> None:
        await asyncio.sleep(0)

    async def _run(
        self, disk_id: str, op: str, numbers: tuple[int, ...], *, source_volume: str = ""
    ) -> disk_tool.ToolResult:
        self.overlaps += [(other, op) for other in self.running]
        self.running.add(op)
        await asyncio.sleep(0.02)
        self.running.discard(op)
        return disk_tool.ToolResult(device="/dev/loop7")


async def test_a_delete_after_a_delete_waits_for_the_attach_queued_between() -> None:
    disks = _Disks()
    first = asyncio.create_task(disks.delete("ws-a"))
    await asyncio.sleep(0.005)  # the delete holds the lock; an attach waits for it
    attach = asyncio.create_task(disks.attach("ws-a"))
    await first
    await asyncio.sleep(0.005)  # the attach runs now; another delete comes
    await asyncio.gather(attach, disks.delete("ws-a"))
    assert disks.overlaps == []
    assert disks._locks == {}  # dropped once nobody holds or waits
