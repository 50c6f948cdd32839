"""The engine's `AgentAttach` on Docker: the agent channel's pipe is the container's attached
stdio (`Tty: false`, so the engine multiplexes stdout and stderr with its 8-byte headers), and
the rescue goes through `docker exec`.

stdout carries the agent's frames; stderr is only its diagnostics, logged at debug and capped.
Nothing of the server's file system is involved, so the same pipe works with a remote engine.
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import aiodocker
import aiohttp
from aiodocker.stream import Stream

from sandboxd.agent.memory import budget_of_container, guard_of_container
from sandboxd.agent.transport import Transport
from sandboxd.engine import compat
from sandboxd.engine.agent_socket import AgentSockets, SocketTransport, connect
from sandboxd.engine.docker_profile import commands_user, with_agent_socket
from sandboxd.engine.protocol import Attached, ExecRequest, ExecStream, Paused, SandboxRequest
from sandboxd.errors import FailedPrecondition, SandboxError
from sandboxd.isolation import Isolation
from sandboxd.labels import LABEL_SESSION
from sandboxd.reasons import Reason


class AttachHost(Protocol):
    """What the agent's pipe and rescue need of the Docker adapter (DockerEngine is one): its
    two clients, its error translation, the keeper's user and its own exec."""

    keeper_user: str

    @property
    def docker(self) -> aiodocker.Docker: ...

    @property
    def channel_docker(self) -> aiodocker.Docker: ...

    def translate(self, what: str) -> contextlib.AbstractContextManager[None]: ...

    def exec(
        self, sandbox_id: str, request: ExecRequest
    ) -> AbstractAsyncContextManager[ExecStream]: ...


log = logging.getLogger(__name__)

STDERR_LOGGED = 64 * 1024  # of the agent's diagnostics per attachment
# Room in the kernel for what the server writes to the agent (an import's frames): a batch of
# the channel's writer (256 KiB) goes in one send instead of partial ones (capped by the
# host's net.core.wmem_max).
ATTACH_SEND_BUFFER = 1024 * 1024
READ_BATCH = 256 * 1024  # of the agent's output already arrived, taken in one read
REFUSALS = 2  # sockets ended unanswered in a row before the attach is the channel


class AttachTransport:
    """One `POST /containers/{id}/attach` hijacked connection, as the channel's Transport."""

    def __init__(self, stream: Stream, name: str) -> None:
        self._stream = stream
        self._name = name
        self._stderr = 0

    async def read(self) -> bytes | None:
        """The agent's next output, joined with what more of it has already arrived (up to
        READ_BATCH): the engine cuts a stream into messages of 32 KiB or less, and each read
        is a turn of the channel's reader and a feed of its decoder."""
        while True:
            try:
                msg = await self._stream.read_out()
                if msg is not None and msg.stream != 2:
                    parts = [bytes(msg.data)]
                    await compat.read_buffered(self._stream, msg.stream, parts, READ_BATCH)
            except (aiohttp.ClientError, OSError, aiodocker.DockerError) as exc:
                log.info("agent pipe of %s ended: %s", self._name, exc)
                return None
            if msg is None:
                return None
            if msg.stream != 2:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            if self._stderr < STDERR_LOGGED:
                text = msg.data[: STDERR_LOGGED - self._stderr]
                self._stderr += len(text)
                log.debug("agent %s: %s", self._name, text.decode(errors="replace").rstrip())

    async def write(self, data: bytes) -> None:
        try:
            await self._stream.write_in(data)
        except (aiohttp.ClientError, RuntimeError, AssertionError) as exc:
            raise ConnectionError(f"the agent pipe of {self._name} is closed: {exc}") from exc

    def write_now(self, data: bytes) -> bool:
        """Write without waiting when the socket takes it now (the channel's writer, idle)."""
        return compat.write_now(self._stream, data)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._stream.close()


class DockerAgentPort:
    """The engine's `AgentAttach` on Docker (what sandboxd.agent.router needs of it)."""

    def __init__(self, engine: AttachHost, socket_owner: str | None = None) -> None:
        self._engine = engine
        # None: every channel over the engine's attach; else the owner id its volumes carry.
        self.sockets = AgentSockets(socket_owner) if socket_owner is not None else None
        self._last: dict[str, SocketTransport] = {}  # the latest socket channel of each
        # Sockets each sandbox's agent ended unanswered in a row, by the start of its
        # container: REFUSALS of them is the agent refusing us (its peer check: it would do
        # so again), one alone may be an agent that was stopping. A restarted container's
        # agent is asked again.
        self._refused: dict[str, tuple[str, int]] = {}
        self.last_kind: dict[str, str] = {}  # "socket" or "attach", per sandbox (tests)

    async def _socket(
        self, sandbox_id: str, host: dict[str, object], started: str = ""
    ) -> SocketTransport | str:
        """The socket channel when the container has one and it connects; else why not (the
        attach then)."""
        sockets = self.sockets
        if sockets is None:
            return "the socket channel is off"
        volume = sockets.source_of(host)
        if volume is None:
            return f"its container (runtime {host.get('Runtime') or 'runc'}) has no socket volume"
        sockets.known(sandbox_id, volume)
        last = self._last.pop(sandbox_id, None)
        if last is not None:
            at, count = self._refused.get(sandbox_id, (started, 0))
            count = (count if at == started else 0) + 1 if last.refused else 0
            self._refused[sandbox_id] = (started, count)
        at, count = self._refused.get(sandbox_id, ("", 0))
        if at == started and count >= REFUSALS:
            return f"its agent ended {count} sockets unanswered"
        try:
            with self._engine.translate(f"inspecting volume {volume}"):
                directory = await sockets.directory(self._engine.docker, volume)
            transport = await connect(directory, sandbox_id[:12])
        except (OSError, SandboxError) as exc:
            return f"socket: {exc}"
        self._last[sandbox_id] = transport
        return transport

    async def with_socket(self, request: SandboxRequest, config: dict[str, Any]) -> dict[str, Any]:
        """The create request with the socket channel, for a runc sandbox whose engine is
        this host's and keeps root as root (agent_socket.py); else as it is."""
        sockets = self.sockets
        if sockets is None or request.spec.isolation is not Isolation.RUNC:
            return config
        with self._engine.translate("engine info"):
            if not await sockets.usable(self._engine.docker):
                return config
        with self._engine.translate(f"creating the agent socket volume of {request.name}"):
            bind = await sockets.prepare(self._engine.docker, request.name)
        return with_agent_socket(config, bind)

    async def abandon(self, name: str) -> None:
        """A create that failed: the socket volume made for it, if any, goes (quietly: the
        create's own error is the one to report)."""
        if self.sockets is not None:
            with contextlib.suppress(Exception):
                await self.sockets.abandon(self._engine.docker, name)

    def created(self, sandbox_id: str, name: str) -> None:
        if self.sockets is not None:
            self.sockets.created(sandbox_id, name)

    async def sweep_sockets(self) -> list[str]:
        """The socket volumes of containers that no longer exist (a server that ended
        before it removed them)."""
        if self.sockets is None:
            return []
        with self._engine.translate("listing containers"):
            found = await self._engine.docker.containers.list(all=True)
        names = [
            str(n).lstrip("/")
            for c in found
            for n in compat.container_document(c).get("Names") or []
        ]
        with self._engine.translate("removing agent socket volumes"):
            return await self.sockets.sweep(self._engine.docker, names)

    async def forget(self, sandbox_id: str) -> None:
        """The container is gone: its socket volume and records go with it."""
        self._last.pop(sandbox_id, None)
        self._refused.pop(sandbox_id, None)
        self.last_kind.pop(sandbox_id, None)
        if self.sockets is not None:
            with self._engine.translate(f"removing the agent socket volume of {sandbox_id[:12]}"):
                await self.sockets.removed(self._engine.docker, sandbox_id)

    async def attach(self, sandbox_id: str) -> Attached | None:
        container = self._engine.docker.containers.container(sandbox_id)
        with self._engine.translate(f"attaching to container {sandbox_id[:12]}"):
            info = await container.show()
        config = info.get("Config") or {}
        user = commands_user(config)
        if user is None:
            return None
        if not (info.get("State") or {}).get("Running"):
            # As `docker exec` answers a stopped container: the session's check follows.
            raise FailedPrecondition(
                f"container {sandbox_id[:12]} is not running", reason=Reason.ENGINE_CONFLICT
            )
        started = str((info.get("State") or {}).get("StartedAt", ""))
        socket = await self._socket(sandbox_id, info.get("HostConfig") or {}, started)
        transport: Transport
        if isinstance(socket, SocketTransport):
            transport, kind = socket, "socket"
        else:
            if socket.startswith("socket:"):
                await self._still_running(sandbox_id, started)
            with self._engine.translate(f"attaching to container {sandbox_id[:12]}"):
                # On the channels' own client: the connection is held while the sandbox lives.
                attaching = self._engine.channel_docker.containers.container(sandbox_id)
                stream = attaching.attach(stdin=True, stdout=True, stderr=True, logs=False)
                await compat.start_stream(stream)
                compat.demux_in_one_copy(stream, ATTACH_SEND_BUFFER)
            transport, kind = AttachTransport(stream, sandbox_id[:12]), f"attach ({socket})"
        self.last_kind[sandbox_id] = kind.split(" ", 1)[0]
        log.info("agent channel of %s: %s", sandbox_id[:12], kind)
        env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
        labels = config.get("Labels") or {}
        return Attached(
            transport,
            user,
            env,
            session_id=str(labels.get(LABEL_SESSION, "")),
            budget=budget_of_container(info.get("HostConfig") or {}),
            guard=guard_of_container(info.get("HostConfig") or {}),
        )

    async def _still_running(self, sandbox_id: str, started: str) -> None:
        """A socket that did not connect: FailedPrecondition when its container stopped or
        started again meanwhile (its agent was going, not refusing), as for one that was
        not running; the attach of a stopping container would end with it."""
        with self._engine.translate(f"inspecting container {sandbox_id[:12]}"):
            state = (await self._engine.docker.containers.container(sandbox_id).show())["State"]
        if not state.get("Running") or str(state.get("StartedAt", "")) != started:
            raise FailedPrecondition(
                f"container {sandbox_id[:12]} stopped while its agent channel was opened",
                reason=Reason.ENGINE_CONFLICT,
            )

    async def rescue(self, sandbox_id: str, user: str) -> str:
        """`kill -KILL -1` as the sandbox user through `docker exec` (every process of that
        user; the agent is root, and PID 1 of the container), then SIGCONT to the agent from
        the engine (an agent stopped from outside the sandbox runs again)."""
        with self._engine.translate(f"inspecting container {sandbox_id[:12]}"):
            state = (await self._engine.docker.containers.container(sandbox_id).show())["State"]
        if state.get("Paused"):
            raise Paused(f"container {sandbox_id[:12]} is paused")
        done = []
        if user == self._engine.keeper_user:  # an older server's egress-only gVisor agent:
            return "left the keeper's processes alone (egress only)"  # no command ran under it
        with contextlib.suppress(Exception):
            async with self._engine.exec(
                sandbox_id, ExecRequest(["/bin/sh", "-c", "kill -KILL -1"], user=user)
            ) as stream:
                while await stream.read() is not None:
                    pass
                done.append(f"killed every process of {user} (exit {await stream.exit_code()})")
        container = self._engine.docker.containers.container(sandbox_id)
        with self._engine.translate(f"waking the agent of {sandbox_id[:12]}"):
            await container.kill(signal="SIGCONT")
        done.append("sent SIGCONT to the agent")
        return ", ".join(done)
