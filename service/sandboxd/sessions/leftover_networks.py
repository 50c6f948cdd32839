"""Networks an older server left behind: removed when this one first reaches the engine.

Before egress went over the agent's channel every ALLOWLIST session had its own Docker
network, `sandboxd-net-<owner>-<session>`, labelled with the owner id like its container.
Sessions have no network now, so nothing removes those of a server upgraded in place. Only
networks carrying this server's owner label AND that name are touched (never another owner's,
never an unlabelled one), and only when no container is attached to them.
"""

from __future__ import annotations

import logging

from sandboxd.engine.protocol import Engine
from sandboxd.errors import SandboxError

log = logging.getLogger(__name__)

NAME_PREFIX = "sandboxd-net-"


async def remove_leftover_networks(engine: Engine, owner_id: str) -> bool:
    """Remove this owner's unused session networks; True when none is left to try again
    (one still in use, by a sandbox of the older server, is tried at each reconcile until
    that sandbox is gone)."""
    done = True
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
        log.info("removed leftover network %s (made by an older server)", network.name)
    return done
