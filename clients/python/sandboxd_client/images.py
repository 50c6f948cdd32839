"""Images from a registry: AdminService.PullImage (progress) and ListImages, as a mixin of
SandboxClient, with their typed results."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Self

from sandboxd_client._convert import timestamp
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import UNSET, rpc

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import images_pb2
else:  # loaded on first use (sandboxd_client._lazy)
    images_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.images_pb2")

# CreateSession's pull_policy, by name (PullPolicy's values without their prefix).
PULL_POLICIES = ("", "IF_NOT_PRESENT", "ALWAYS", "NEVER")


def pull_policy_pb(name: str) -> images_pb2.PullPolicy.ValueType:
    key = name.upper()
    try:
        if key not in PULL_POLICIES:
            raise KeyError(key)
        return images_pb2.PullPolicy.Value(f"PULL_POLICY_{key or 'UNSPECIFIED'}")
    except KeyError:
        raise ValueError(
            f"pull_policy must be one of IF_NOT_PRESENT, ALWAYS, NEVER: {name!r}"
        ) from None


@dataclasses.dataclass(frozen=True)
class PullProgress:
    """Bytes of the layers fetched so far (summed over layers), as the engine reports them."""

    status: str
    current_bytes: int
    total_bytes: int
    layers_total: int
    layers_done: int


@dataclasses.dataclass(frozen=True)
class PullDone:
    image_digest: str


@dataclasses.dataclass(frozen=True)
class ImageInfo:
    name: str
    digest: str
    size_bytes: int
    last_used_at: dt.datetime | None = None

    @classmethod
    def from_pb(cls, m: images_pb2.ImageInfo) -> Self:
        return cls(m.name, m.digest, m.size_bytes, timestamp(m, "last_used_at"))


def pull_event(m: images_pb2.PullImageResponse) -> PullProgress | PullDone:
    if m.WhichOneof("event") == "done":
        return PullDone(m.done.image_digest)
    p = m.progress
    return PullProgress(p.status, p.current_bytes, p.total_bytes, p.layers_total, p.layers_done)


class ImagesMixin:
    """SandboxClient's image calls (admin): pre-warm a pull, list usable images."""

    stubs: Any
    _server_stream: Callable[..., AsyncIterator[Any]]
    _unary: Callable[..., Awaitable[Any]]
    _paged: Callable[..., AsyncIterator[Any]]

    @rpc("AdminService/PullImage")
    async def pull_image(
        self, image: str, *, timeout: float | None = None
    ) -> AsyncIterator[PullProgress | PullDone]:
        """Pull an image the caller may use: progress events, then PullDone with its digest."""
        req = images_pb2.PullImageRequest(image=image)
        async for resp in self._server_stream(
            lambda t: self.stubs.admin.PullImage(req, timeout=t), timeout
        ):
            yield pull_event(resp)

    @rpc("AdminService/ListImages")
    async def list_images(
        self, *, page_size: int = 0, timeout: float | None = UNSET
    ) -> AsyncIterator[ImageInfo]:
        """Images the caller may use that the engine holds, with digest, size and last use,
        following pages as the loop goes (`page_size` 0: all in one reply)."""
        async for resp in self._paged(
            "AdminService/ListImages",
            lambda token, t: self.stubs.admin.ListImages(
                images_pb2.ListImagesRequest(page_size=page_size, page_token=token), timeout=t
            ),
            timeout,
        ):
            for i in resp.images:
                yield ImageInfo.from_pb(i)


__all__ = ["ImageInfo", "ImagesMixin", "PullDone", "PullProgress", "pull_policy_pb"]
