"""Images from a registry: proto <-> domain (pull policy, pull progress, image listing)."""

from __future__ import annotations

from sandboxd.api.pb_time import time_pb
from sandboxd.models import PullPolicy
from sandboxd.pulls import PulledImage, PullEvent, Resolved
from sandboxd.v1 import images_pb2

_POLICY: dict[int, PullPolicy] = {
    images_pb2.PULL_POLICY_UNSPECIFIED: PullPolicy.IF_NOT_PRESENT,
    images_pb2.PULL_POLICY_IF_NOT_PRESENT: PullPolicy.IF_NOT_PRESENT,
    images_pb2.PULL_POLICY_ALWAYS: PullPolicy.ALWAYS,
    images_pb2.PULL_POLICY_NEVER: PullPolicy.NEVER,
}


def pull_policy(value: int) -> PullPolicy:
    """An unknown number (a newer client) is the default, the one that never surprises."""
    return _POLICY.get(value, PullPolicy.IF_NOT_PRESENT)


def pull_event_pb(event: PullEvent | Resolved) -> images_pb2.PullImageResponse:
    if isinstance(event, Resolved):
        return images_pb2.PullImageResponse(
            done=images_pb2.PullImageDone(image_digest=event.digest)
        )
    return images_pb2.PullImageResponse(
        progress=images_pb2.PullImageProgress(
            status=event.status,
            current_bytes=event.current_bytes,
            total_bytes=event.total_bytes,
            layers_total=event.layers_total,
            layers_done=event.layers_done,
        )
    )


def image_info_pb(image: PulledImage, last_used_at: float) -> images_pb2.ImageInfo:
    info = images_pb2.ImageInfo(name=image.name, digest=image.digest, size_bytes=image.size_bytes)
    if last_used_at > 0:
        ts = time_pb(last_used_at)
        info.last_used_at.CopyFrom(ts)
        info.last_used_time.CopyFrom(ts)
    return info
