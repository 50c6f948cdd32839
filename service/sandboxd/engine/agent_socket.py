"""The agent channel over a Unix socket, beside a local engine, for runc sandboxes.

Over the engine's attach every frame crosses dockerd and the containerd shim both ways
(docs/performance.md: their CPU per Run). Beside a local engine the server makes a directory
of its own per container (its uid, mode 0700, under data_dir), the engine binds it into the
sandbox at AGENT_SOCKET_DIR, and the agent listens there (`--channel-socket`); the server
connects straight to it. Commands run as the session's non-root uid and cannot enter the
directory; the agent also checks each peer's credentials (helper/agent_sock.c). The attach
stays the fallback: gVisor (the socket would be the Sentry's, not the host's), a remote or
user-namespaced engine (the path is not this host's, or root is not root), any failed connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

AGENT_SOCKET_DIR = "/run/sbx-agent"
SOCKET_NAME = "agent.sock"
AGENT_SOCKET = f"{AGENT_SOCKET_DIR}/{SOCKET_NAME}"
BIND_MODE = "rw"
CONNECT_WAIT_S = 1.0  # the agent listens first thing at start; the server may be quicker
READ_SIZE = 1 << 18
SWEEP_AGE_S = 120.0  # a directory younger than this may be a create in progress
ROOT_NAME = "agent-sockets"  # under data_dir; docker_profile.conforms knows binds by it


class SocketTransport:
    """The channel's Transport over a connected Unix stream to the agent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str):
        self._reader = reader
        self._writer = writer
        self._name = name
        self.received = 0  # bytes read: none at EOF means the agent refused or never served

    async def read(self) -> bytes | None:
        try:
            chunk = await self._reader.read(READ_SIZE)
        except OSError as exc:
            log.info("agent socket of %s ended: %s", self._name, exc)
            return None
        self.received += len(chunk)
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
        with contextlib.suppress(Exception):
            self._writer.close()
            await self._writer.wait_closed()


async def connect(directory: Path, name: str, wait_s: float = CONNECT_WAIT_S) -> SocketTransport:
    """A connection to the agent listening in `directory`; OSError when none comes in `wait_s`.

    Through an O_PATH descriptor of the directory: `/proc/self/fd/N/agent.sock` fits the
    108 bytes of sun_path whatever the length of data_dir. Only a directory that is the
    server's alone (its uid, no access for group or others): in any other, someone else could
    have put a listener of theirs in the agent's place."""
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
    """The per-container socket directories under data_dir/agent-sockets."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir.absolute() / ROOT_NAME
        self._dirs: dict[str, Path] = {}  # container id -> its directory, once known
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

    def directory(self, container_name: str) -> Path:
        return self.root / hashlib.sha256(container_name.encode()).hexdigest()[:24]

    def prepare(self, container_name: str) -> str:
        """The container's directory, new and empty, owned by the server, 0700; its bind."""
        path = self.directory(container_name)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(mode=0o700)
        os.chmod(path, 0o700)
        return f"{path}:{AGENT_SOCKET_DIR}:{BIND_MODE}"

    def created(self, container_id: str, container_name: str) -> None:
        self._dirs[container_id] = self.directory(container_name)

    def source_of(self, host_config: Mapping[str, Any]) -> Path | None:
        """The socket directory a container binds at AGENT_SOCKET_DIR, when it is one of ours
        (a direct child of the root)."""
        for bind in host_config.get("Binds") or []:
            parts = str(bind).split(":")
            if len(parts) == 3 and parts[1:] == [AGENT_SOCKET_DIR, BIND_MODE]:
                source = Path(parts[0])
                if source.parent == self.root and source.name == source.name.strip("."):
                    return source
        return None

    def known(self, container_id: str, directory: Path) -> None:
        self._dirs[container_id] = directory

    def removed(self, container_id: str) -> None:
        directory = self._dirs.pop(container_id, None)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def sweep(self, container_names: Iterable[str]) -> list[str]:
        """Remove the directories of containers that no longer exist (a server that ended
        before removing them); those younger than SWEEP_AGE_S may be a create in progress."""
        keep = {self.directory(n).name for n in container_names}
        gone: list[str] = []
        with contextlib.suppress(FileNotFoundError):
            for entry in self.root.iterdir():
                with contextlib.suppress(OSError):
                    if entry.name in keep or time.time() - entry.lstat().st_mtime < SWEEP_AGE_S:
                        continue
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
                    gone.append(f"agent socket directory {entry.name}")
        return gone
