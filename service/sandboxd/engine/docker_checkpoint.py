"""Memory checkpoints of gVisor sandboxes on Docker, through the Engine API only.

Docker checkpoints a runsc container into `<data root>/containers/<id>/checkpoints/<name>`
(the engine must run in experimental mode), and starts one from there with `?checkpoint=`; it
refuses a checkpoint folder of the caller's choosing ("custom checkpointdir is not supported").
So the image is carried in and out of that folder by a *carrier*: a container that is created,
never started, with that folder bind-mounted (the engine resolves the path on its own host, from
its `DockerRootDir`), and read or written with the archive API. Nothing here reads the engine
host's disk, so a remote engine works like a local one.

Every checkpoint is restored into a NEW container of the same shape, never into the one it came
from: runsc leaves the state of a restored sandbox behind, and a second restore under the same
id fails with "id already in use". `--leave-running` is never used (runsc panics on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from typing import Any

import aiodocker
import aiohttp

from sandboxd.errors import FailedPrecondition, SandboxError
from sandboxd.reasons import Reason

_ID = re.compile(r"\A[0-9a-f]{64}\Z")
_NAME = re.compile(r"\A[a-z0-9][a-z0-9-]{0,63}\Z")
_INSIDE = "/ckpt"  # where a carrier sees the sandbox's checkpoints folder
READ_CHUNK = 256 * 1024
START_ATTEMPTS, START_RETRY_S = 5, 1.0
# A checkpoint of a large memory takes seconds (the spike: 200 MiB of random pages, 6-10 s).
CHECKPOINT_TIMEOUT_S = 300.0

Translate = Callable[[str], AbstractContextManager[None]]


def capability(info: dict[str, Any], runtime: str) -> str:
    """Empty when `docker info` says the engine can checkpoint a sandbox of `runtime`."""
    if not info.get("ExperimentalBuild"):
        return "the Docker engine is not in experimental mode (checkpoints need it)"
    if runtime not in (info.get("Runtimes") or {}):
        return f"the gVisor runtime {runtime!r} is not registered with the engine"
    if not info.get("DockerRootDir"):
        return "the engine does not say where its data root is"
    return ""


def _checked(sandbox_id: str, name: str) -> None:
    if not _ID.match(sandbox_id) or not _NAME.match(name):
        raise FailedPrecondition(
            f"not a sandbox id and checkpoint name: {sandbox_id[:70]!r} {name[:70]!r}",
            reason=Reason.MEMORY_SUSPEND_UNSUPPORTED,
        )


class DockerCheckpoints:
    """The engine side of a memory suspend: checkpoint, read out, place and start."""

    def __init__(
        self, docker: aiodocker.Docker, translate: Translate, labels: dict[str, str]
    ) -> None:
        self._docker = docker
        self._translate = translate
        self._labels = labels  # a carrier's (engine/work_containers.py)

    async def checkpoint(self, sandbox_id: str, name: str) -> None:
        """The sandbox frozen, written out and stopped (`Exit`: never left running)."""
        _checked(sandbox_id, name)
        with self._translate(f"checkpointing container {sandbox_id[:12]}"):
            async with self._docker._query(
                f"containers/{sandbox_id}/checkpoints",
                "POST",
                data=json.dumps({"CheckpointID": name, "Exit": True}),
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=CHECKPOINT_TIMEOUT_S),
            ) as response:
                await response.read()

    async def read(self, sandbox_id: str, name: str) -> AsyncIterator[bytes]:
        """The checkpoint folder `name` as a tar (its one top entry is `name/`)."""
        _checked(sandbox_id, name)
        async with self._carrier(sandbox_id) as carrier:
            with self._translate(f"reading checkpoint {name} of {sandbox_id[:12]}"):
                async with self._docker._query(
                    f"containers/{carrier}/archive",
                    "GET",
                    params={"path": f"{_INSIDE}/{name}"},
                    timeout=aiohttp.ClientTimeout(total=CHECKPOINT_TIMEOUT_S),
                ) as response:
                    async for chunk in response.content.iter_chunked(READ_CHUNK):
                        yield chunk

    async def place(self, sandbox_id: str, chunks: AsyncIterator[bytes]) -> None:
        """A checkpoint tar (as `read` made it) into the sandbox's checkpoints folder."""
        _checked(sandbox_id, "placed")
        async with self._carrier(sandbox_id) as carrier:
            with self._translate(f"placing a checkpoint in {sandbox_id[:12]}"):
                async with self._docker._query(
                    f"containers/{carrier}/archive",
                    "PUT",
                    params={"path": _INSIDE, "noOverwriteDirNonDir": "true"},
                    data=chunks,
                    headers={"content-type": "application/x-tar"},
                    timeout=aiohttp.ClientTimeout(total=CHECKPOINT_TIMEOUT_S),
                ) as response:
                    await response.read()

    async def start(self, sandbox_id: str, name: str) -> None:
        """Start the (created) sandbox from its checkpoint `name`.

        The engine uploads the image to containerd's content store first, and refuses ("commit
        failed: content ... already exists") while that store still holds the same bytes from
        the checkpoint it came from, until containerd's garbage collection removes them: a
        refusal of that kind is tried again, a few times."""
        _checked(sandbox_id, name)
        for attempt in range(START_ATTEMPTS):
            try:
                with self._translate(f"restoring container {sandbox_id[:12]} from {name}"):
                    async with self._docker._query(
                        f"containers/{sandbox_id}/start",
                        "POST",
                        params={"checkpoint": name},
                        timeout=aiohttp.ClientTimeout(total=CHECKPOINT_TIMEOUT_S),
                    ) as response:
                        await response.read()
                return
            except SandboxError as exc:
                if "already exists" not in exc.message or attempt == START_ATTEMPTS - 1:
                    raise
            await asyncio.sleep(START_RETRY_S)

    async def forget(self, sandbox_id: str, name: str) -> None:
        """The engine's copy of a checkpoint, once restored (the server keeps its own)."""
        _checked(sandbox_id, name)
        with contextlib.suppress(aiodocker.DockerError):
            await self._docker._query_json(f"containers/{sandbox_id}/checkpoints/{name}", "DELETE")

    @contextlib.asynccontextmanager
    async def _carrier(self, sandbox_id: str) -> AsyncIterator[str]:
        """A created, never started container of the sandbox's image with the sandbox's
        checkpoints folder at /ckpt; removed on the way out. No network, no capabilities,
        a read-only root: it never runs anything, the engine only reads and writes its mount."""
        with self._translate(f"inspecting container {sandbox_id[:12]}"):
            info = await self._docker.containers.container(sandbox_id).show()
            root = str((await self._docker.system.info()).get("DockerRootDir") or "")
        image = str(info["Image"])
        folder = f"{root}/containers/{sandbox_id}/checkpoints"
        config: dict[str, Any] = {
            "Image": image,
            "Cmd": ["/nonexistent"],
            "Entrypoint": [],
            "Labels": self._labels,
            "NetworkDisabled": True,
            "HostConfig": {
                "NetworkMode": "none",
                "ReadonlyRootfs": True,
                "CapDrop": ["ALL"],
                "Binds": [f"{folder}:{_INSIDE}:rw"],
            },
        }
        name = f"sandboxd-carrier-{secrets.token_hex(6)}"
        with self._translate(f"creating a checkpoint carrier for {sandbox_id[:12]}"):
            carrier = await self._docker.containers.create(config, name=name)
        try:
            yield str(carrier.id)
        finally:
            with contextlib.suppress(aiodocker.DockerError):
                await carrier.delete(force=True)
