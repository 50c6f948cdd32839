"""The Docker implementation of the `Engine` protocol (aiodocker).

Everything else talks to Docker only through the protocol. Engine failures come out as domain
errors: a connection that fails is `EngineUnavailable`, a missing object is `NotFound`, and
anything else the engine refuses is `Internal` carrying the engine's own message. Private
attributes of aiodocker/aiohttp are reached only through `compat`, whose version check runs
when the engine is entered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiodocker
import aiohttp
from aiodocker.containers import DockerContainer

from sandboxd import images
from sandboxd.engine import (
    compat,
    docker_build,
    docker_checkpoint,
    docker_commit,
    docker_networks,
    docker_pull,
    docker_stats,
    work_containers,
)
from sandboxd.engine.docker_attach import DockerAgentPort
from sandboxd.engine.docker_errors import translate_errors
from sandboxd.engine.docker_exec import DockerExecStream, exec_status, resize, start_exec
from sandboxd.engine.docker_profile import conforms, container_config, shape_of
from sandboxd.engine.docker_volumes import with_volume_sources
from sandboxd.engine.helper_volume import HelperVolume
from sandboxd.engine.host_cgroup import raise_memory, write_cpu
from sandboxd.engine.protocol import (
    AgentAttach,
    ExecRequest,
    ExecStatus,
    ImageDetails,
    NetworkInfo,
    PullProgress,
    SandboxInfo,
    SandboxRequest,
    SandboxStats,
    SandboxStatus,
)
from sandboxd.engine.runsc_leftovers import AFTER_CHECKPOINT, end_leftovers
from sandboxd.engine.work_containers import new_run_id
from sandboxd.engine_address import EngineAddress, engine_address
from sandboxd.errors import FailedPrecondition, NotFound
from sandboxd.isolation import Isolation
from sandboxd.labels import LABEL_OWNER, WORK_CHECKPOINT_CARRIER
from sandboxd.storage.docker_disks import DockerDisks

# Every request has a deadline (streams of exec output excepted: those last as long as the
# command, bounded by its own timeout).
_ENGINE_TIMEOUT = aiohttp.ClientTimeout(total=60, connect=5, sock_connect=5)
REMOVE_TIMEOUT_S = 20.0


class DockerEngine:
    """A long-lived Docker client with a connection pool sized for many open exec streams."""

    def __init__(
        self,
        docker_host: str = "",
        pool_size: int = 1024,
        *,
        helper_path: Path,
        keeper_user: str,
        on_error: Callable[[str], None] | None = None,
        gvisor_runtime: str = "runsc",
        address: EngineAddress | None = None,
        agent: bool = False,
        owner_id: str = "",
        disk_tool_image: str = "sandboxd-disktool:1",
        agent_socket: bool = False,
    ) -> None:
        # The engine runtime of each tier: HostConfig.Runtime of every sandbox says which.
        self._runtimes = {Isolation.RUNC: "runc", Isolation.GVISOR: gvisor_runtime}
        self._helper = HelperVolume(helper_path)  # mounted read-only in every sandbox
        self._keeper_user = keeper_user
        self.keeper_user = keeper_user  # an agent running as this user carries egress only
        self._on_error = on_error  # told the kind of every engine failure (metrics)
        # tcp:// with TLS: the checked address the server built from its settings
        # (engine_address.py).
        self._address = address or engine_address(docker_host)
        self._local = self._address.local
        self._pool_size = pool_size
        self._docker: aiodocker.Docker | None = None
        self._channel_docker: aiodocker.Docker | None = None
        self.api_version = ""
        self._committing: set[str] = set()  # names of the commit stand-ins in use now
        # Disk workspaces and volumes (sandboxd.storage), made by a tool container.
        self._owner_id = owner_id
        self._run_id = new_run_id()  # on this process's work containers (work_containers)
        self.disks = DockerDisks(
            lambda: self.docker,
            self._translate,
            owner_id=owner_id,
            tool_image=disk_tool_image,
            run_id=self._run_id,
        )
        self._checkpointed: set[str] = set()  # sandboxes whose removal leaves runsc's shim
        # With an agent, sandboxes run `sbx agent` as their main process, attached to by the
        # server's router (sandboxd.agent.router); commands then go over its channel: for runc,
        # a Unix socket when the engine's is one on this host (agent_socket.py; not TCP).
        socket_owner = owner_id if agent_socket and self._address.socket_path else None
        self._agent_port = DockerAgentPort(self, socket_owner) if agent else None

    async def __aenter__(self) -> DockerEngine:
        compat.check_versions()
        # One long-lived client; every open exec stream holds one connection: size the pool.
        address = self._address
        self._connector = address.connector(self._pool_size)
        # With our own connector aiodocker only composes URLs from this: a dummy host for a unix
        # socket (from unix:// it builds "unix:/path/version", refused by aiohttp), or https://.
        self._docker = aiodocker.Docker(
            url=address.url, connector=self._connector, timeout=_ENGINE_TIMEOUT
        )
        # The agents' channels on a client of their own, its pool unbounded (one connection per
        # live sandbox, for its life): in the API's pool, docker_pool_size live sessions would
        # leave none for any engine call (a create, the delete that would free one) forever.
        self._channel_connector = address.connector(0)
        self._channel_docker = aiodocker.Docker(
            url=address.url, connector=self._channel_connector, timeout=_ENGINE_TIMEOUT
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._channel_docker is not None:
            await self._channel_docker.close()
            await self._channel_connector.close()
        if self._docker is not None:
            await self._docker.close()
        await self._connector.close()

    @property
    def agent_port(self) -> AgentAttach | None:
        return self._agent_port

    @property
    def docker(self) -> aiodocker.Docker:
        if self._docker is None:
            raise RuntimeError("Engine used outside its 'async with'")
        return self._docker

    @property
    def channel_docker(self) -> aiodocker.Docker:
        """The client the agents' channels attach with (its own, unbounded pool)."""
        if self._channel_docker is None:
            raise RuntimeError("Engine used outside its 'async with'")
        return self._channel_docker

    async def ping(self) -> str:
        """The engine's API version; raises EngineUnavailable when it does not answer."""
        with self._translate("engine ping"):
            version = await asyncio.wait_for(self.docker.version(), timeout=5)
        self.api_version = str(version.get("ApiVersion", ""))
        return self.api_version

    async def image_exists(self, image: str) -> bool:
        """Whether the image is present; one that declares VOLUMEs is refused here, since a
        Docker volume is writable host disk outside every limit of the session."""
        try:
            with self._translate(f"image {image}"):
                info = await self.docker.images.inspect(image)
        except NotFound:
            return False
        images.refuse_volumes(image, info)
        return True

    async def isolation_tiers(self) -> frozenset[Isolation]:
        """The tiers whose runtime is registered with the engine (`docker info` Runtimes)."""
        with self._translate("engine info"):
            info = await self.docker.system.info()
        registered = set((info.get("Runtimes") or {}).keys())
        return frozenset(t for t, name in self._runtimes.items() if name in registered)

    # ----- sandboxes ---------------------------------------------------------------------

    def _config(self, request: SandboxRequest, workspace_volume: str = "") -> dict[str, Any]:
        return container_config(
            request,
            workspace_volume=workspace_volume,
            helper_volume=self._helper.name,
            keeper_user=self._keeper_user,
            runtime=self._runtimes[request.spec.isolation],
            # The same agent under every runtime (`sbx agent --user`: docs/agent.md).
            agent=self._agent_port is not None,
        )

    def sandbox_shape(self, request: SandboxRequest) -> str:
        return shape_of(self._config(request))

    async def create_sandbox(self, request: SandboxRequest) -> str:
        with self._translate(f"filling the helper volume {self._helper.name}"):
            await self._helper.ensure(self.docker, request.spec.image)
        # Volumes: each disk attached now (again after a host restart), on the loop it is on.
        request = await with_volume_sources(self.disks, request)
        # A disk workspace: attached now (again after a host restart), on the loop it is on.
        volume = await self.disks.attach(request.spec.disk_id) if request.spec.on_disk else ""
        config, port = self._config(request, volume), self._agent_port
        config = await port.with_socket(request, config) if port is not None else config
        try:
            with self._translate(f"creating container {request.name}"):
                container = await self.docker.containers.create(config, name=request.name)
        except BaseException:
            if port is not None:  # its socket volume, if it got one: no container holds it
                await asyncio.shield(port.abandon(request.name))
            raise
        if port is not None:
            port.created(str(container.id), request.name)
        return str(container.id)

    async def start_sandbox(self, sandbox_id: str) -> None:
        try:
            with self._translate(f"starting container {sandbox_id[:12]}"):
                await self._container(sandbox_id).start()
        except BaseException:
            # A runsc start that failed may leave its gofer/sandbox processes on this host.
            if self._local:
                await asyncio.shield(asyncio.to_thread(end_leftovers, sandbox_id))
            raise
        if host := await self._gvisor_host(sandbox_id):  # before any command runs
            await asyncio.to_thread(raise_memory, sandbox_id, *host)

    async def _gvisor_host(self, sandbox_id: str) -> tuple[int, dict[str, Any]] | None:
        """A gVisor sandbox's host pid and HostConfig beside a local engine, whose host cgroup
        the server writes (host_cgroup.py: runsc has no `update`); None for any other."""
        info = await self._inspect(sandbox_id) if self._local else None
        if not info or info["HostConfig"].get("Runtime") != self._runtimes[Isolation.GVISOR]:
            return None
        return int((info.get("State") or {}).get("Pid") or 0), info["HostConfig"]

    async def set_cpu_shares(self, sandbox_id: str, shares: int, cpu_millis: int = 0) -> None:
        """`docker update --cpu-shares [--cpus]`; a gVisor sandbox's host cgroup instead."""
        if host := await self._gvisor_host(sandbox_id):
            return await asyncio.to_thread(write_cpu, sandbox_id, host[0], shares, cpu_millis)
        data = {"CpuShares": shares, **({"NanoCpus": cpu_millis * 10**6} if cpu_millis else {})}
        with self._translate(f"updating the CPU weight of container {sandbox_id[:12]}"):
            await self.docker._query_json(f"containers/{sandbox_id}/update", "POST", data=data)

    def cpu_in_place(self, isolation: Isolation) -> bool:
        return isolation is Isolation.RUNC or self._local

    async def remove_sandbox(self, sandbox_id: str) -> None:
        """Force-remove; a container that is already gone is not an error.

        Bounded: a removal that does not finish within REMOVE_TIMEOUT_S (a paused container on
        an engine that will not kill a frozen one) is retried once after an unpause."""
        container = self._container(sandbox_id)
        try:
            with self._translate(f"removing container {sandbox_id[:12]}"):
                try:
                    async with asyncio.timeout(REMOVE_TIMEOUT_S):
                        await container.delete(force=True, v=True)
                except TimeoutError:
                    with contextlib.suppress(aiodocker.DockerError):
                        await asyncio.wait_for(container.unpause(), REMOVE_TIMEOUT_S)
                    await asyncio.wait_for(container.delete(force=True, v=True), REMOVE_TIMEOUT_S)
        except NotFound:
            pass
        except FailedPrecondition:
            await self._wait_removed(sandbox_id)
        if self._agent_port is not None:  # its socket volume, if it has one
            await self._agent_port.forget(sandbox_id)
        if sandbox_id in self._checkpointed:
            self._checkpointed.discard(sandbox_id)
            if self._local:  # a remote engine's host keeps them (docs/suspend.md)
                names = AFTER_CHECKPOINT
                await asyncio.shield(asyncio.to_thread(end_leftovers, sandbox_id, names=names))

    async def _wait_removed(self, sandbox_id: str) -> None:
        """Someone else's removal is in progress: return only once it is gone, so a caller
        that reports "removed" (an expired lease, a deleted session) is telling the truth."""
        for _ in range(100):
            if await self._inspect(sandbox_id) is None:
                return
            await asyncio.sleep(0.1)

    async def _inspect(self, sandbox_id: str) -> dict[str, Any] | None:
        try:
            with self._translate(f"inspecting container {sandbox_id[:12]}"):
                return dict(await self._container(sandbox_id).show())
        except NotFound:
            return None

    async def inspect_sandbox(
        self, sandbox_id: str, expected: SandboxRequest | None = None
    ) -> SandboxStatus | None:
        if not sandbox_id:
            return None
        info = await self._inspect(sandbox_id)
        if info is None:
            return None
        running = bool((info.get("State") or {}).get("Running"))
        ok = expected is None or conforms(self._config(expected), info)
        return SandboxStatus(running=running, conforms=ok)

    async def list_sandboxes(self, owner_id: str) -> list[SandboxInfo]:
        filters = {"label": [f"{LABEL_OWNER}={owner_id}"]}
        with self._translate("listing containers"):
            found = await self.docker.containers.list(all=True, filters=filters)
        return work_containers.sandboxes(compat.container_document(c) for c in found)

    # ----- the engine's own exec (engine.protocol.EngineExec: docker_exec) ---------------

    @contextlib.asynccontextmanager
    async def exec(self, sandbox_id: str, request: ExecRequest) -> AsyncIterator[DockerExecStream]:
        """A `docker exec`: the path without an agent, and the rescue path. With `tty` the
        command gets a terminal: its output arrives as one stream (fd 1)."""
        with self._translate(f"exec in container {sandbox_id[:12]}"):
            handle = await start_exec(self, self._container(sandbox_id), request)
        try:
            yield handle
        finally:
            await handle.close()

    async def exec_resize(self, exec_id: str, rows: int, cols: int) -> None:
        """Set the terminal size of a running tty exec (the command gets SIGWINCH)."""
        with self._translate(f"resizing exec {exec_id[:12]}"):
            await resize(self.docker, exec_id, rows, cols)

    async def exec_status(self, exec_id: str) -> ExecStatus:
        with self._translate(f"inspecting exec {exec_id[:12]}"):
            return await exec_status(self.docker, exec_id)

    def _translate(self, what: str) -> contextlib.AbstractContextManager[None]:
        return translate_errors(what, self._on_error)

    translate = _translate  # for the engine's own helpers (docker_attach)

    # ----- memory checkpoints (docker_checkpoint) -----------------------------------------

    async def memory_checkpoints(self) -> str:
        with self._translate("engine info"):
            info = await self.docker.system.info()
        return docker_checkpoint.capability(dict(info), self._runtimes[Isolation.GVISOR])

    def _checkpoints(self) -> docker_checkpoint.DockerCheckpoints:
        return docker_checkpoint.DockerCheckpoints(
            self.docker,
            self._translate,
            work_containers.labels(self._owner_id, WORK_CHECKPOINT_CARRIER, self._run_id),
        )

    async def checkpoint_sandbox(self, sandbox_id: str, name: str) -> None:
        self._checkpointed.add(sandbox_id)
        await self._checkpoints().checkpoint(sandbox_id, name)

    def read_checkpoint(self, sandbox_id: str, name: str) -> AsyncIterator[bytes]:
        return self._checkpoints().read(sandbox_id, name)

    async def restore_sandbox(
        self, sandbox_id: str, name: str, chunks: AsyncIterator[bytes]
    ) -> None:
        checkpoints = self._checkpoints()
        await checkpoints.place(sandbox_id, chunks)
        try:
            await checkpoints.start(sandbox_id, name)
        except BaseException:
            if self._local:
                await asyncio.shield(asyncio.to_thread(end_leftovers, sandbox_id))
            raise
        if host := await self._gvisor_host(sandbox_id):
            await asyncio.to_thread(raise_memory, sandbox_id, *host)
        await checkpoints.forget(sandbox_id, name)

    # ----- images (IMAGE snapshots) ------------------------------------------------------

    async def commit_sandbox(
        self, sandbox_id: str, repository: str, tag: str, labels: Mapping[str, str]
    ) -> str:
        """Freeze the sandbox's filesystem into an image (`docker_commit`: a stand-in is
        committed, so that the image carries none of the sandbox's runtime config)."""
        return await docker_commit.commit(
            self.docker, self._translate, sandbox_id, repository, tag, labels, self._committing
        )

    async def remove_work_leftovers(self, owner_id: str) -> list[str]:
        stand_ins = await docker_commit.leftovers(
            self.docker, self._translate, owner_id, self._committing
        )
        work = await work_containers.leftovers(self.docker, self._translate, owner_id, self._run_id)
        port = self._agent_port  # and the socket directories of containers gone
        return stand_ins + work + (await port.sweep_sockets() if port is not None else [])

    async def remove_image(self, image: str) -> None:
        """One already gone is not an error; one in use is ENGINE_CONFLICT, to retry later."""
        try:
            with self._translate(f"removing image {image[:80]}"):
                await self.docker.images.delete(image, force=False)
        except NotFound:
            pass

    async def list_images(self, owner_id: str) -> list[str]:
        filters = {"label": [f"{LABEL_OWNER}={owner_id}"]}
        with self._translate("listing images"):
            found = await self.docker.images.list(filters=filters)
        return [str(i.get("Id", "")) for i in found if i.get("Id")]

    # ----- leftover networks (sandboxd.engine.docker_networks) ---------------------------

    async def list_networks(self, owner_id: str) -> list[NetworkInfo]:
        with self._translate("listing networks"):
            return await docker_networks.owned(self.docker, owner_id)

    async def remove_network(self, network_id: str) -> None:
        try:
            with self._translate(f"removing network {network_id[:12]}"):
                await docker_networks.remove(self.docker, network_id)
        except NotFound:
            pass

    def _container(self, sandbox_id: str) -> DockerContainer:
        return self.docker.containers.container(sandbox_id)

    # ----- observation (docker_stats) -----------------------------------------------------

    async def sandbox_stats(self, sandbox_id: str) -> SandboxStats:
        with self._translate(f"stats of container {sandbox_id[:12]}"):
            return await docker_stats.read_stats(self.docker, sandbox_id)

    async def oom_kills(self, owner_id: str) -> AsyncIterator[str]:
        with self._translate("engine events"):
            async for sandbox_id in docker_stats.oom_kills(self.docker, owner_id):
                yield sandbox_id

    # ----- registry pulls (sandboxd.engine.docker_pull) ----------------------------------

    async def inspect_image(self, image: str) -> ImageDetails | None:
        return await docker_pull.inspect(self.docker, image)

    def pull_image(
        self, reference: str, auth: Mapping[str, str] | None = None
    ) -> AsyncIterator[PullProgress]:
        return docker_pull.pull(self.docker, reference, auth)

    # ----- image builds (sandboxd.engine.docker_build) -----------------------------------

    def build_image(self, context: Path, **options: Any) -> AsyncGenerator[str, None]:
        return docker_build.build(self.docker, context, **options)

    async def prune_images(self, labels: Mapping[str, str]) -> None:
        with self._translate("pruning images"):
            await docker_build.prune(self.docker, labels)

    async def build_usage(self, labels: Mapping[str, str]) -> int:
        with self._translate("measuring a build"):
            return await docker_build.usage(self.docker, labels)
