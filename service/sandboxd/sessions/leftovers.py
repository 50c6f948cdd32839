"""What an older or a dead server left on the engine: removed when this one first reaches it
(the start-up reconcile), and by each sweep's reconcile while some could not be removed yet.

Networks: before egress went over the agent's channel every ALLOWLIST session had its own
Docker network, `sandboxd-net-<owner>-<session>`, labelled with the owner id like its
container. Sessions have no network now, so nothing removes those of a server upgraded in
place. Only networks carrying this server's owner label AND that name are touched (never
another owner's, never an unlabelled one), and only when no container is attached to them.

Work containers: the never-started container an IMAGE snapshot is committed from, a disk tool
run and a memory checkpoint's carrier, left by a server that died in the middle of that work
(the engine finds them by their own labels: engine/work_containers.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sandboxd.engine.protocol import Engine
from sandboxd.errors import SandboxError

log = logging.getLogger(__name__)

NAME_PREFIX = "sandboxd-net-"


@dataclass(frozen=True)
class Removed:
    """What one pass removed (`networks`: what Sweep reports as `removed_networks`), and
    whether none is left to try again."""

    networks: int
    done: bool


async def remove_leftovers(engine: Engine, owner_id: str) -> Removed:
    """Remove this owner's leftovers. One not removed (a network still in use, by a sandbox
    of the older server; an engine error) leaves `done` False: it is tried at each reconcile
    until it is gone."""
    done = True
    try:
        for name in await engine.remove_work_leftovers(owner_id):
            log.info("removed the work container %s of work cut short", name)
    except SandboxError as exc:
        log.warning("work leftovers not removed: %s", exc)
        done = False
    networks = await _remove_networks(engine, owner_id)
    return Removed(networks=networks.networks, done=networks.done and done)


async def _remove_networks(engine: Engine, owner_id: str) -> Removed:
    done = True
    removed = 0
    prefix = f"{NAME_PREFIX}{owner_id}-"
    for network in await engine.list_networks(owner_id):
        if not network.name.startswith(prefix):
            continue
        if network.containers:
            log.info(
                "leftover network %s kept: %d container(s) still attached",
                network.name,
                network.containers,
            )
            done = False
            continue
        try:
            await engine.remove_network(network.network_id)
        except SandboxError as exc:
            log.warning("leftover network %s not removed: %s", network.name, exc)
            done = False
            continue
        removed += 1
        log.info("removed leftover network %s (made by an older server)", network.name)
    return Removed(networks=removed, done=done)
