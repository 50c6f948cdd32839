"""What one tenant's own images hold of the engine's disk, and the quota on it.

A tenant writes images to the engine's disk two ways: template builds (BuildTemplate) and
image snapshots (CreateSnapshot kind IMAGE, a commit of its sandbox). Both count against
`tenant_max_image_bytes`, by each image's whole size as the engine reports it (its base's
layers included: a base shared by two images is counted twice, so the count never falls short
of what the tenant holds). Pulled images are not the tenant's: `max_image_bytes` and the
image sweep bound them.

Checked before a build or a commit starts (no room: refused), while a build runs (its limit is
the room left, less what the tenant's other running builds have made so far) and on the image
made (over: removed, refused). Two operations at once may each pass the first check; the
second still stops at its own limit, so the total passes the quota by at most one build's
measuring interval.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sandboxd.engine.protocol import Engine
from sandboxd.errors import ResourceExhausted
from sandboxd.reasons import Reason
from sandboxd.templates.store import TemplateState, TemplateStore

SnapshotImages = Callable[[str], Awaitable[list[str]]]
UNLIMITED = 1 << 62


class ImageQuota:
    def __init__(
        self,
        quota_bytes: int,
        engine: Engine,
        templates: TemplateStore,
        snapshot_images: SnapshotImages,
        checkpoint_bytes: Callable[[str], Awaitable[int]] | None = None,
    ) -> None:
        self.quota_bytes = quota_bytes  # 0: no cap
        self._engine = engine
        self._templates = templates
        self._snapshot_images = snapshot_images
        # Memory suspends' checkpoints: the tenant's memory on the server's disk counts too.
        self._checkpoint_bytes = checkpoint_bytes
        self.building: dict[tuple[str, str], int] = {}  # (tenant, name) -> bytes made so far

    async def used(self, tenant: str, *, besides: str = "") -> int:
        """Bytes of the tenant's ready templates (but `besides`, the one a build replaces)
        and image snapshots."""
        total = sum(
            t.size_bytes
            for t in await self._templates.of_tenant(tenant)
            if t.state is TemplateState.READY and t.name != besides
        )
        for image in await self._snapshot_images(tenant):
            details = await self._engine.inspect_image(image)
            total += details.size_bytes if details is not None else 0
        if self._checkpoint_bytes is not None:
            total += await self._checkpoint_bytes(tenant)
        return total

    async def room(self, tenant: str, *, besides: str = "") -> int:
        """Bytes the tenant may still add besides its running builds (UNLIMITED without a
        quota); a build's limit is this less what the others have made when it measures."""
        if not self.quota_bytes:
            return UNLIMITED
        return self.quota_bytes - await self.used(tenant, besides=besides)

    def running(self, tenant: str, *, besides: str = "") -> int:
        """Bytes the tenant's running builds (but `besides`) have made so far."""
        return sum(b for (t, n), b in self.building.items() if t == tenant and n != besides)

    def refused(self, what: str) -> ResourceExhausted:
        return ResourceExhausted(
            f"{what} would pass the tenant's image quota of {self.quota_bytes} bytes "
            "(setting tenant_max_image_bytes: templates and image snapshots together); "
            "delete templates or image snapshots first",
            reason=Reason.TENANT_IMAGE_QUOTA,
            metadata={"limit_bytes": str(self.quota_bytes)},
        )

    async def check_room(self, tenant: str, what: str, *, besides: str = "") -> int:
        """`room`; refused (TENANT_IMAGE_QUOTA) when the running builds leave none."""
        left = await self.room(tenant, besides=besides)
        if left - self.running(tenant, besides=besides) <= 0:
            raise self.refused(what)
        return left

    async def check_checkpoint_room(self, tenant: str, need: int) -> None:
        """A memory suspend may write up to the session's memory limit: refused
        (TENANT_IMAGE_QUOTA) before anything stops when the quota leaves less room."""
        if self.quota_bytes and await self.room(tenant) - self.running(tenant) < need:
            raise self.refused(f"a memory checkpoint of up to {need} bytes")
