"""The engine's own work containers: a disk tool run (storage/docker_disks.py) and a memory
checkpoint's carrier (engine/docker_checkpoint.py), each created, used and removed within one
call. A server that dies in that call leaves its container behind, and nothing else would
ever remove it: it is not a sandbox (reconcile skips it, or it would be removed mid-run).

So each carries the owner label, `LABEL_WORK` (what it does) and `LABEL_WORK_RUN`, an id drawn
once per server process: a work container of this owner whose run is not this process's is a
leftover of a dead one (one server process per owner id at a time), removed at the start-up
reconcile, however long ago it was made. One of this process's own is never touched: its call
removes it.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiodocker

from sandboxd.engine import compat
from sandboxd.engine.protocol import SandboxInfo
from sandboxd.errors import SandboxError
from sandboxd.labels import LABEL_OWNER, LABEL_POOL, LABEL_SESSION, LABEL_WORK, LABEL_WORK_RUN
from sandboxd.storage.disk_tool import LABEL_DISK_TOOL

log = logging.getLogger(__name__)

Translate = Callable[[str], contextlib.AbstractContextManager[None]]


def new_run_id() -> str:
    """This server process's run id (drawn once, when the engine adapter is made)."""
    return secrets.token_hex(8)


def labels(owner_id: str, work: str, run_id: str) -> dict[str, str]:
    return {LABEL_OWNER: owner_id, LABEL_WORK: work, LABEL_WORK_RUN: run_id}


def is_work(container_labels: dict[str, str]) -> bool:
    """A work container, not a sandbox (a disk tool run of an older server has only
    `LABEL_DISK_TOOL`)."""
    return LABEL_WORK in container_labels or LABEL_DISK_TOOL in container_labels


async def leftovers(
    docker: aiodocker.Docker, translate: Translate, owner_id: str, run_id: str
) -> list[str]:
    """Remove this owner's work containers that another server process made; their names."""

    def left(doc: Mapping[str, Any]) -> bool:
        found = doc.get("Labels") or {}
        return is_work(found) and found.get(LABEL_WORK_RUN) != run_id

    owned = {"label": [f"{LABEL_OWNER}={owner_id}"]}
    return await remove_left(docker, translate, owned, left, "work container of an earlier server")


async def remove_left(
    docker: aiodocker.Docker,
    translate: Translate,
    filters: Mapping[str, list[str]],
    left: Callable[[Mapping[str, Any]], bool],
    what: str,
) -> list[str]:
    """Remove the containers `filters` lists that are `left` behind (told by their list
    document: what a call under way holds is not); their names. One that will not go is
    logged and left to the next reconcile: it is not counted as removed."""
    with translate("listing containers"):
        found = await docker.containers.list(all=True, filters=dict(filters))
    removed = []
    for container in found:
        doc = compat.container_document(container)
        if not left(doc):
            continue
        name = str((doc.get("Names") or [""])[0]).lstrip("/")
        try:
            with translate(f"removing container {str(doc.get('Id', ''))[:12]}"):
                await container.delete(force=True)
        except SandboxError as exc:
            log.warning("%s %s not removed: %s", what, name, exc)
            continue
        removed.append(name)
    return removed


def sandboxes(docs: Iterable[Mapping[str, Any]]) -> list[SandboxInfo]:
    """The sandboxes among an owner's containers (their list documents): not its work ones."""
    result = []
    for doc in docs:
        marks = doc.get("Labels") or {}
        if is_work(marks):
            # A work container (a disk tool run, a checkpoint carrier) is not a sandbox:
            # reconcile would take it for an orphan and remove it mid-run; its call
            # removes it, and remove_work_leftovers those of a dead server.
            continue
        result.append(
            SandboxInfo(
                sandbox_id=str(doc["Id"]),
                name=str((doc.get("Names") or [""])[0]).lstrip("/"),
                session_id=str(marks.get(LABEL_SESSION, "")),
                pool_generation=str(marks.get(LABEL_POOL, "")),
                running=doc.get("State") == "running",
            )
        )
    return result
