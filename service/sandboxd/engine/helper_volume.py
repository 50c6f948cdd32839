"""The helper `sbx` as every sandbox sees it: a read-only volume named after its content.

Never bound from the server's own file: a bind shows the server host's path in the sandbox's
/proc/self/mountinfo. The volume is named by the helper's digest, so servers of the same build
share it and a new build gets its own; it is filled through a container that is created, never
started (the engine's archive API writes into its volume).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import tarfile
from pathlib import Path

import aiodocker
from aiodocker.containers import DockerContainer

from sandboxd.errors import Internal

HELPER_VOLUME_PREFIX = "sandboxd-helper-"
LABEL_HELPER = "io.sandboxd.helper"


def _file_sha256(path: Path) -> str:
    """Read once, when the engine is made (start-up): the helper is about a MiB."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _single_file_tar(name: str, data: bytes, mode: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.uid, info.gid = len(data), mode, 0, 0
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def _archived_file(container: DockerContainer, path: str) -> bytes | None:
    """The content of one file of a container (through a volume), None when missing."""
    try:
        tar = await container.get_archive(path)
    except aiodocker.DockerError as exc:
        if exc.status == 404:
            return None
        raise
    with tar:
        member = tar.next()
        got = tar.extractfile(member) if member is not None and member.isreg() else None
        return got.read() if got is not None else None


class HelperVolume:
    def __init__(self, helper_path: Path) -> None:
        self._path = helper_path
        self.name = HELPER_VOLUME_PREFIX + _file_sha256(helper_path)[:32]
        self._lock = asyncio.Lock()
        self._ready = False

    async def ensure(self, docker: aiodocker.Docker, image: str) -> None:
        """The volume holds exactly the helper (checked by content, filled if not). One cheap
        inspect per create once it is there: an engine whose volumes were wiped gets it back.
        Engine errors are the caller's to translate."""
        async with self._lock:
            try:
                await docker.volumes.get(self.name)  # type: ignore[no-untyped-call]
                if self._ready:
                    return
            except aiodocker.DockerError as exc:
                if exc.status != 404:
                    raise
            data = await asyncio.to_thread(self._path.read_bytes)
            if HELPER_VOLUME_PREFIX + hashlib.sha256(data).hexdigest()[:32] != self.name:
                raise Internal(f"the helper {self._path} changed since the server started")
            await docker.volumes.create(  # type: ignore[no-untyped-call]
                {
                    "Name": self.name,
                    "Labels": {LABEL_HELPER: self.name[len(HELPER_VOLUME_PREFIX) :]},
                }
            )
            filler = await docker.containers.create(
                {
                    "Image": image,
                    "Cmd": ["true"],
                    "Entrypoint": [],
                    "NetworkDisabled": True,
                    "Labels": {LABEL_HELPER: "filler"},
                    "HostConfig": {"Binds": [f"{self.name}:/h"], "NetworkMode": "none"},
                }
            )
            try:
                if await _archived_file(filler, "/h/sbx") != data:
                    # A file object: aiohttp streams it (raw bytes over 1 MiB, as the helper
                    # now is, would be sent in one blocking write, and warned about).
                    payload = io.BytesIO(_single_file_tar("sbx", data, 0o755))
                    await filler.put_archive("/h", payload)  # type: ignore[no-untyped-call]
            finally:
                await filler.delete(force=True)
            self._ready = True
