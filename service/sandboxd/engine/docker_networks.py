"""Networks labelled with a server's owner id, on the Docker Engine API.

Sessions have had no network since egress went over the agent's channel; servers before that
made one internal network per ALLOWLIST session, labelled like its container. A server
upgraded from one finds them at start and removes those no container holds
(sandboxd.sessions.leftovers).
"""

from __future__ import annotations

import aiodocker

from sandboxd.engine.protocol import NetworkInfo
from sandboxd.labels import LABEL_OWNER


async def owned(docker: aiodocker.Docker, owner_id: str) -> list[NetworkInfo]:
    """Each network labelled with `owner_id`; the containers it holds come from its inspect
    (the list answer leaves them out). One gone between the two is left out."""
    filters = {"label": [f"{LABEL_OWNER}={owner_id}"]}
    found = await docker.networks.list(filters=filters)
    result = []
    for item in found:
        network_id = str(item.get("Id", ""))
        try:
            info = await (await docker.networks.get(network_id)).show()
        except aiodocker.DockerError as exc:
            if exc.status == 404:
                continue
            raise
        labels = info.get("Labels") or {}
        if labels.get(LABEL_OWNER) != owner_id:  # the engine's filter, checked again
            continue
        result.append(
            NetworkInfo(
                network_id=network_id,
                name=str(info.get("Name", "")),
                containers=len(info.get("Containers") or {}),
            )
        )
    return result


async def remove(docker: aiodocker.Docker, network_id: str) -> None:
    network = await docker.networks.get(network_id)
    await network.delete()
