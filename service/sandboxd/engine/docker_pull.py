"""Registry pulls and image inspection on the Docker Engine API (the Docker adapter's part).

`docker pull` reports failures as text in its progress stream (or as the HTTP status of the
call); they are read here into domain errors with the reasons of "Images from a registry", so a
caller learns whether the image is missing, the server's credentials were refused, the registry
did not answer, or something else failed.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiodocker

from sandboxd.engine.docker_errors import engine_unavailable
from sandboxd.engine.protocol import ImageDetails, PullProgress
from sandboxd.errors import (
    EngineUnavailable,
    FailedPrecondition,
    Internal,
    NotFound,
    SandboxError,
    Unavailable,
)
from sandboxd.reasons import Reason

_NOT_FOUND = re.compile(
    r"manifest unknown|not found|does not exist|name unknown|repository name not known", re.I
)
_UNAUTHORIZED = re.compile(
    r"unauthorized|authentication required|no basic auth credentials|denied|forbidden", re.I
)
_UNREACHABLE = re.compile(
    r"connection refused|no such host|i/o timeout|timeout|dial tcp|connection reset|"
    r"server gave HTTP response to HTTPS client|network is unreachable|EOF",
    re.I,
)


def pull_error(
    reference: str, status: int, message: str, cause: BaseException | None = None
) -> SandboxError:
    """The domain error of a failed pull, from the engine's status and message."""
    text = message.strip()[:400] or f"HTTP {status}"
    meta = {"image": reference[:200]}
    if status == 900:
        return engine_unavailable(f"pulling {reference}", cause or EngineUnavailable(text), text)
    # Order matters: "pull access denied ... repository does not exist" is a missing image.
    if _NOT_FOUND.search(text) or status == 404:
        return NotFound(
            f"image {reference!r} is not in its registry: {text}",
            reason=Reason.REGISTRY_IMAGE_NOT_FOUND,
            metadata=meta,
        )
    if _UNAUTHORIZED.search(text):
        return FailedPrecondition(
            f"the registry refused this server's credentials for {reference!r} (operator "
            f"setting registry_auth_file): {text}",
            reason=Reason.REGISTRY_UNAUTHORIZED,
            metadata=meta,
        )
    if _UNREACHABLE.search(text):
        return Unavailable(
            f"the registry of {reference!r} does not answer: {text}",
            reason=Reason.REGISTRY_UNREACHABLE,
            metadata=meta,
        )
    return Internal(
        f"pulling {reference!r} failed: {text}", reason=Reason.IMAGE_PULL_FAILED, metadata=meta
    )


def _progress(line: Mapping[str, Any]) -> PullProgress:
    detail = line.get("progressDetail") or {}
    return PullProgress(
        status=str(line.get("status", ""))[:200],
        layer=str(line.get("id", "")) if "progressDetail" in line else "",
        current=int(detail.get("current") or 0),
        total=int(detail.get("total") or 0),
    )


async def pull(
    docker: aiodocker.Docker, reference: str, auth: Mapping[str, str] | None
) -> AsyncIterator[PullProgress]:
    """`docker pull` with its progress; closing the generator drops the call (and the pull)."""
    registry_auth: dict[str, Any] | None = None
    if auth:
        host = reference.split("/", 1)[0]
        registry_auth = {
            "username": auth.get("username", ""),
            "password": auth.get("password", ""),
            "serveraddress": host,
        }
    try:
        async for line in docker.images.pull(
            reference, auth=registry_auth, stream=True, timeout=None
        ):
            if line.get("error") or line.get("errorDetail"):
                detail = line.get("errorDetail") or {}
                raise pull_error(reference, 500, str(line.get("error") or detail.get("message")))
            yield _progress(line)
    except aiodocker.DockerError as exc:
        raise pull_error(reference, exc.status, str(exc.message), exc) from exc
    except (TimeoutError, OSError) as exc:
        detail = f"{type(exc).__name__}: {exc}"
        raise engine_unavailable(f"pulling {reference}", exc, detail) from exc


async def inspect(docker: aiodocker.Docker, image: str) -> ImageDetails | None:
    try:
        info = await docker.images.inspect(image)
    except aiodocker.DockerError as exc:
        if exc.status == 404:
            return None
        raise pull_error(image, exc.status, str(exc.message), exc) from exc
    return ImageDetails(
        image_id=str(info.get("Id", "")),
        repo_digests=tuple(str(d) for d in info.get("RepoDigests") or ()),
        repo_tags=tuple(str(t) for t in info.get("RepoTags") or ()),
        size_bytes=int(info.get("Size") or 0),
        onbuild=tuple(str(t) for t in (info.get("Config") or {}).get("OnBuild") or ()),
    )
