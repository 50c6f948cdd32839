"""Volume disks on Docker (the `VolumeDisks` port of sandboxd.volumes).

Every disk is an engine volume labelled with this server's owner id, made and removed through
the engine's API (nothing is shared between the server's host and the engine's). A disk is
handed to the session that mounts it read-write: its files become that session's host uid's
(each session runs as a uid of its own, sandboxd.host_ids), by a short-lived container of the
runtime image that holds only CAP_CHOWN, CAP_FOWNER and CAP_DAC_READ_SEARCH, no network, a
read-only root, and runs `chown -R -h` (never through a symlink) with numbers only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Any

import aiodocker

from sandboxd.engine.docker_errors import translate_errors
from sandboxd.errors import Internal, NotFound

log = logging.getLogger(__name__)

LABEL_VOLUME_DISK = "io.sandboxd.volume-disk"
LABEL_VOLUME_OWNER = "io.sandboxd.owner"
OWN_TIMEOUT_S = 600.0
# Runs as root with three capabilities; $1 and $2 are integers the server checked.
_OWN_SCRIPT = 'chmod 0755 /v && chown -R -h "$1:$2" /v'


def own_config(image: str, disk: str, uid: int, gid: int, labels: dict[str, str]) -> dict[str, Any]:
    numeric = (isinstance(n, int) and not isinstance(n, bool) for n in (uid, gid))
    if not all(numeric) or not (0 < uid < 2**31 and 0 < gid < 2**31):
        raise Internal(f"volume owner {uid}:{gid} is not a non-root numeric id")
    return {
        "Image": image,
        "Cmd": ["/bin/sh", "-c", _OWN_SCRIPT, "own", str(uid), str(gid)],
        "Entrypoint": [],
        "User": "0:0",
        "WorkingDir": "/",
        "Env": ["PATH=/bin:/usr/bin"],
        "Labels": labels,
        "NetworkDisabled": True,
        "HostConfig": {
            "NetworkMode": "none",
            "Runtime": "runc",
            "ReadonlyRootfs": True,
            "CapDrop": ["ALL"],
            "CapAdd": ["CHOWN", "FOWNER", "DAC_READ_SEARCH"],
            "SecurityOpt": ["no-new-privileges:true"],
            "Privileged": False,
            "Mounts": [{"Type": "volume", "Source": disk, "Target": "/v"}],
            "Memory": 64 * 1024 * 1024,
            "PidsLimit": 16,
            "RestartPolicy": {"Name": "no"},
            "AutoRemove": False,
            "LogConfig": {"Type": "json-file", "Config": {"max-size": "64k"}},
        },
    }


class DockerVolumeDisks:
    """The disks of named volumes as engine volumes of this server."""

    def __init__(self, docker: aiodocker.Docker, owner_id: str, image: str) -> None:
        self._docker = docker
        self._owner_id = owner_id
        self._image = image  # the runtime image: has sh, chmod and chown

    def _labels(self, name: str) -> dict[str, str]:
        return {LABEL_VOLUME_OWNER: self._owner_id, LABEL_VOLUME_DISK: name}

    async def create_disk(self, name: str, size_bytes: int) -> None:
        with translate_errors(f"creating volume disk {name}"):
            await self._docker.volumes.create(  # type: ignore[no-untyped-call]
                {"Name": name, "Labels": self._labels(name)}
            )

    async def remove_disk(self, name: str) -> None:
        with contextlib.suppress(NotFound), translate_errors(f"removing volume disk {name}"):
            volume = await self._docker.volumes.get(name)  # type: ignore[no-untyped-call]
            await volume.delete()

    async def disk_used_bytes(self, name: str) -> int:
        return 0  # a plain engine volume has no cheap usage figure

    async def list_disks(self, prefix: str) -> list[str]:
        with translate_errors("listing volume disks"):
            found = await self._docker.volumes.list(  # type: ignore[no-untyped-call]
                filters={"label": [f"{LABEL_VOLUME_OWNER}={self._owner_id}", LABEL_VOLUME_DISK]}
            )
        names = [str(v.get("Name", "")) for v in (found or {}).get("Volumes") or []]
        return sorted(n for n in names if n.startswith(prefix))

    async def own_disk(self, name: str, uid: int, gid: int) -> None:
        """Every file of the disk owned by uid:gid, its root 0755 (readers read by mode)."""
        labels = {**self._labels(name), "io.sandboxd.volume-own": "1"}
        config = own_config(self._image, name, uid, gid, labels)
        container_name = f"sandboxd-own-{self._owner_id}-{secrets.token_hex(6)}"
        with translate_errors(f"handing volume disk {name} to {uid}:{gid}"):
            container = await self._docker.containers.create(config, name=container_name)
            try:
                await container.start()
                status = await asyncio.wait_for(container.wait(), OWN_TIMEOUT_S)
                code = int((status or {}).get("StatusCode", -1))
                if code != 0:
                    logs = await container.log(stdout=True, stderr=True)
                    said = "".join(logs)[-300:]
                    raise Internal(f"handing volume disk {name} over failed ({code}): {said}")
            finally:
                with contextlib.suppress(aiodocker.DockerError):
                    await asyncio.shield(container.delete(force=True))
