"""The agent channel over a Unix socket, beside a local engine, for runc sandboxes.

Over the engine's attach every frame crosses dockerd and the containerd shim both ways
(docs/performance.md: their CPU per Run). Beside a local engine each container gets a socket
volume of its own (a tmpfs of root's, mode 0700, made by the engine's local driver), bound in
at AGENT_SOCKET_DIR; the agent listens there (`--channel-socket`) and the server connects to it
at the volume's mountpoint on this host. Commands run as the session's non-root uid and cannot
enter the directory; the agent also checks each peer's credentials (helper/agent_sock.c). The
attach stays the fallback: gVisor (the socket would be the Sentry's, not the host's), a remote
or user-namespaced engine (the path is not this host's, or root is not root), any failed
connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import stat
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import aiodocker

from sandboxd.labels import LABEL_AGENT_SOCKET, LABEL_OWNER

log = logging.getLogger(__name__)

AGENT_SOCKET_DIR = "/run/sbx-agent"
SOCKET_NAME = "agent.sock"
AGENT_SOCKET = f"{AGENT_SOCKET_DIR}/{SOCKET_NAME}"
BIND_MODE = "rw"
# The agent listens first thing at start, and the server may be quicker; on a loaded host
# (tens of runnable processes) that first thing can take seconds.
CONNECT_WAIT_S = 5.0
READ_SIZE = 1 << 18
SWEEP_AGE_S = 120.0  # a volume younger than this may be a create in progress
VOLUME_PREFIX = "sandboxd-agent-"  # + 24 hex; docker_profile.conforms knows binds by it
_VOLUME = re.compile(re.escape(VOLUME_PREFIX) + "[0-9a-f]{24}")
# One socket and nothing else: a few inodes, no exec, no device, no set-id; root's alone.
TMPFS_OPTIONS = "size=64k,nr_inodes=16,mode=0700,uid=0,gid=0,noexec,nosuid,nodev"


class SocketTransport:
    """The channel's Transport over a connected Unix stream to the agent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str):
        self._reader = reader
        self._writer = writer
        self._name = name
        self.received = 0  # bytes read
        # The agent ended it before any answer: it refuses us (its peer check), and a next
        # connect would be refused too. An end after our own close (a cancelled start, a
        # HELLO that timed out on a loaded host) is not a refusal.
        self.refused = False
        self._closed = False

    async def read(self) -> bytes | None:
        try:
            chunk = await self._reader.read(READ_SIZE)
        except OSError as exc:
            log.info("agent socket of %s ended: %s", self._name, exc)
            chunk = b""
        self.received += len(chunk)
        if not chunk:
            self.refused = not self._closed and self.received == 0
        return chunk or None

    async def write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (OSError, RuntimeError) as exc:
            raise ConnectionError(f"the agent socket of {self._name} is closed: {exc}") from exc

    def write_now(self, data: bytes) -> bool:
        """Written at once when nothing of ours waits in the transport's buffer."""
        transport = self._writer.transport
        if transport.is_closing() or transport.get_write_buffer_size():
            return False
        self._writer.write(data)
        return True

    async def close(self) -> None:
        self._closed = True
        with contextlib.suppress(Exception):
            self._writer.close()
            await self._writer.wait_closed()


async def connect(directory: Path, name: str, wait_s: float = CONNECT_WAIT_S) -> SocketTransport:
    """A connection to the agent listening in `directory`; OSError when none comes in `wait_s`.

    Through an O_PATH descriptor of the directory: `/proc/self/fd/N/agent.sock` fits the
    108 bytes of sun_path whatever the length of the path. Only a directory that is the
    server's alone (its uid, no access for group or others, not a symlink): in any other,
    someone else could have put a listener of theirs in the agent's place."""
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise PermissionError(
                f"agent socket directory {directory} is not the server's alone "
                f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})"
            )
        deadline = time.monotonic() + wait_s
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(
                    f"/proc/self/fd/{fd}/{SOCKET_NAME}", limit=READ_SIZE * 4
                )
                return SocketTransport(reader, writer, name)
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.02)
    finally:
        os.close(fd)


class AgentSockets:
    """The per-container socket volumes: a small tmpfs each, made by the engine's local driver.

    A volume, not a directory of the server's bound in: a bind shows its source's path in the
    sandbox's /proc/self/mountinfo (a host path of the server), a tmpfs volume shows `/` on
    `tmpfs`. The engine mounts it at the container's start and unmounts it at its stop, so
    nothing is left in the host's mount table; the server reaches it at the volume's
    mountpoint on this host, only while it is mounted (before, the directory is the engine's
    0755, which `connect` refuses)."""

    def __init__(self, owner_id: str) -> None:
        self._owner_id = owner_id
        self._volumes: dict[str, str] = {}  # container id -> its socket volume, once known
        self._usable: bool | None = None

    async def usable(self, docker: Any) -> bool:
        """Whether the engine's root is this host's root: not a user-namespaced or rootless
        engine (its uid 0 maps to another, which could not enter a 0700 directory of root)."""
        if self._usable is None:
            info = await docker.system.info()
            options = " ".join(info.get("SecurityOptions") or [])
            self._usable = "name=userns" not in options and "name=rootless" not in options
            if not self._usable:
                log.info("agent channels over the engine's attach: the engine remaps root")
        return self._usable

    @staticmethod
    def volume_name(container_name: str) -> str:
        return VOLUME_PREFIX + hashlib.sha256(container_name.encode()).hexdigest()[:24]

    async def prepare(self, docker: Any, container_name: str) -> str:
        """The container's socket volume, new and empty; its bind. A volume of that name left
        by an earlier create is removed first (a create retried after a failed one)."""
        name = self.volume_name(container_name)
        await self._delete(docker, name)
        await docker.volumes.create(
            {
                "Name": name,
                "Driver": "local",
                "DriverOpts": {"type": "tmpfs", "device": "tmpfs", "o": TMPFS_OPTIONS},
                "Labels": {LABEL_OWNER: self._owner_id, LABEL_AGENT_SOCKET: container_name},
            }
        )
        return f"{name}:{AGENT_SOCKET_DIR}:{BIND_MODE}"

    def created(self, container_id: str, container_name: str) -> None:
        self._volumes[container_id] = self.volume_name(container_name)

    @staticmethod
    def source_of(host_config: Mapping[str, Any]) -> str | None:
        """The socket volume a container binds at AGENT_SOCKET_DIR, when it is one of ours
        by its name; None for any other bind there."""
        for bind in host_config.get("Binds") or []:
            volume = socket_volume_of(str(bind))
            if volume is not None:
                return volume
        return None

    async def directory(self, docker: Any, volume: str) -> Path:
        """Where the volume is mounted on this host; PermissionError when it is not ours (its
        owner label, the local driver's tmpfs): someone else's could hold their listener."""
        info = await docker._query_json(f"volumes/{volume}")
        options = info.get("Options") or {}
        labels = info.get("Labels") or {}
        if (
            labels.get(LABEL_OWNER) != self._owner_id
            or info.get("Driver") != "local"
            or options.get("type") != "tmpfs"
        ):
            raise PermissionError(f"agent socket volume {volume} is not one of this server's")
        return Path(str(info.get("Mountpoint") or ""))

    def known(self, container_id: str, volume: str) -> None:
        self._volumes[container_id] = volume

    async def removed(self, docker: Any, container_id: str) -> None:
        volume = self._volumes.pop(container_id, None)
        if volume is not None:
            await self._delete(docker, volume)

    async def abandon(self, docker: Any, container_name: str) -> None:
        await self._delete(docker, self.volume_name(container_name))

    async def sweep(self, docker: Any, container_names: Iterable[str]) -> list[str]:
        """Remove the socket volumes of containers that no longer exist (a server that ended
        before removing them); those younger than SWEEP_AGE_S may be a create in progress."""
        keep = {self.volume_name(n) for n in container_names}
        found = await docker.volumes.list(
            filters={"label": [f"{LABEL_OWNER}={self._owner_id}", LABEL_AGENT_SOCKET]}
        )
        gone: list[str] = []
        for v in found.get("Volumes") or []:
            name = str(v.get("Name", ""))
            if name in keep or socket_volume_of(f"{name}:{AGENT_SOCKET_DIR}:{BIND_MODE}") is None:
                continue
            if _age_s(str(v.get("CreatedAt", ""))) < SWEEP_AGE_S:
                continue
            if await self._delete(docker, name):
                gone.append(f"agent socket volume {name}")
        return gone

    @staticmethod
    async def _delete(docker: Any, name: str) -> bool:
        """True when this call removed it. One already gone is no error; one still in use
        (its container not gone yet) stays, for the sweep."""
        try:
            await aiodocker.volumes.DockerVolume(docker, name).delete()  # type: ignore[no-untyped-call]
        except aiodocker.DockerError as exc:
            if exc.status == 404:
                return False
            log.info("agent socket volume %s stays: %s", name, exc)
            return False
        return True


def socket_volume_of(bind: str) -> str | None:
    """The socket volume of a bind `NAME:/run/sbx-agent:rw`, when NAME is one of ours; else
    None (a host path, another volume, another place or mode)."""
    parts = bind.split(":")
    if len(parts) == 3 and parts[1:] == [AGENT_SOCKET_DIR, BIND_MODE]:
        if _VOLUME.fullmatch(parts[0]):
            return parts[0]
    return None


def _age_s(created_at: str) -> float:
    """Seconds since the engine's RFC 3339 CreatedAt; 0 when it cannot be read (kept)."""
    try:
        created = datetime.fromisoformat(created_at.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return max(0.0, time.time() - created.timestamp())
