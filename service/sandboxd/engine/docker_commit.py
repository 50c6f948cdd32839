"""IMAGE snapshots on the Docker Engine API: a sandbox's filesystem frozen into an image that
carries nothing of the sandbox's runtime config.

Docker's commit merges the committed container's config (Env, Cmd, User, Labels...) into the
image and no key can be taken back out: a commit of the sandbox itself would hand its
session's env (secrets, placeholders, proxy), its agent command and its user to every session
started from the image. The sandbox's root filesystem is read-only (a checked control): its
changes live only in tmpfs mounts a commit never holds. So a stand-in created from the
sandbox's own image with that image's config, never started, is committed: the same
filesystem, the image's own config, plus the snapshot's labels. A stand-in is labelled
`LABEL_COMMIT_OF` (blanked on the image): one left by a server that died mid-commit is
removed by the next one's reconcile (`leftovers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiodocker
from aiodocker.containers import DockerContainer

from sandboxd.engine import work_containers
from sandboxd.errors import Internal, SandboxError
from sandboxd.labels import LABEL_COMMIT_OF, LABEL_OWNER, LABEL_PREFIX

log = logging.getLogger(__name__)

Translate = Callable[[str], contextlib.AbstractContextManager[None]]


async def commit(
    docker: aiodocker.Docker,
    translate: Translate,
    sandbox_id: str,
    repository: str,
    tag: str,
    labels: Mapping[str, str],
    in_flight: set[str],
) -> str:
    """The new image's id (tagged `repository:tag`, labelled `labels`). `in_flight`: the names
    of the stand-ins of commits under way, which `leftovers` leaves alone."""
    with translate(f"inspecting container {sandbox_id[:12]}"):
        info = await docker.containers.container(sandbox_id).show()
    if not (info.get("HostConfig") or {}).get("ReadonlyRootfs"):
        raise Internal(f"container {sandbox_id[:12]} has a writable root: not committed")
    image_id = str(info.get("Image", ""))
    with translate(f"inspecting image {image_id[:19]}"):
        image = await docker.images.inspect(image_id)
    base = image.get("Config") or {}
    name = f"{repository}-{tag}"
    in_flight.add(name)
    try:
        with translate(f"committing container {sandbox_id[:12]}"):
            stand_in = await docker.containers.create(
                stand_in_config(image_id, base, labels.get(LABEL_OWNER, "")), name=name
            )
    except BaseException:
        in_flight.discard(name)
        raise
    try:
        with translate(f"committing container {sandbox_id[:12]}"):
            result = await stand_in.commit(
                repository=repository,
                tag=tag,
                config={"Labels": commit_labels(base.get("Labels") or {}, labels)},
                pause=False,
            )
    finally:
        await asyncio.shield(_remove(stand_in, translate))
        in_flight.discard(name)
    return str(result.get("Id", ""))


async def leftovers(
    docker: aiodocker.Docker, translate: Translate, owner_id: str, in_flight: set[str]
) -> list[str]:
    """Remove this owner's stand-ins that no commit under way holds; their names."""

    def left(doc: Mapping[str, Any]) -> bool:
        return str((doc.get("Names") or [""])[0]).lstrip("/") not in in_flight

    filters = {"label": [f"{LABEL_COMMIT_OF}={owner_id}"], "status": ["created"]}
    return await work_containers.remove_left(docker, translate, filters, left, "commit stand-in")


async def _remove(container: DockerContainer, translate: Translate) -> None:
    try:
        with translate(f"removing container {container.id[:12]}"):
            await container.delete(force=True)
    except SandboxError as exc:  # never started, no processes: only a name left behind
        log.warning("commit stand-in %s not removed: %s", container.id[:12], exc)


def stand_in_config(
    image_id: str, image_config: Mapping[str, Any], owner_id: str
) -> dict[str, Any]:
    """The create request of a commit's stand-in: the image alone, so that every field of its
    config is the image's, and the label that finds it if it is left behind. Docker refuses a
    container without a command: an image that has none gets a placeholder, the one thing of
    the stand-in its commit keeps."""
    config: dict[str, Any] = {"Image": image_id, "Labels": {LABEL_COMMIT_OF: owner_id}}
    if not image_config.get("Cmd") and not image_config.get("Entrypoint"):
        config["Cmd"] = ["true"]
    return config


def commit_labels(base: Mapping[str, str], labels: Mapping[str, str]) -> dict[str, str]:
    """The labels a commit is given: `labels`, and every sandboxd label of the base image and
    the stand-in's blanked (a commit keeps each label of its base, none can be removed): the
    base's template build would otherwise have the template's deletion prune the new image
    with its own."""
    blanked = {k: "" for k in base if k.startswith(LABEL_PREFIX) and k not in labels}
    return {**blanked, LABEL_COMMIT_OF: "", **labels}
