"""The engine's lifecycle with the agents' channels kept in step: a channel opens when its
sandbox starts (or is restored from a checkpoint), closes when it is removed, and is told
when a checkpoint stops its sandbox on purpose.

The engine only attaches and rescues (`engine.protocol.AgentAttach`); the router owns the
channels. This wrapper is how the two meet: the server wraps its engine in it once
(server/parts.py), so every caller of the lifecycle (sessions, the pool, the porter, the
sweeper) keeps the channels right without knowing of them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path

from sandboxd.agent.router import AgentRouter
from sandboxd.engine.protocol import (
    AgentAttach,
    BuildLimits,
    Engine,
    ImageDetails,
    NetworkInfo,
    PullProgress,
    SandboxInfo,
    SandboxRequest,
    SandboxStats,
    SandboxStatus,
)
from sandboxd.errors import FailedPrecondition
from sandboxd.isolation import Isolation
from sandboxd.reasons import Reason
from sandboxd.storage.disks import Disks


def suspended() -> FailedPrecondition:
    """What a stream open on a sandbox is told when a memory suspend stops it."""
    return FailedPrecondition(
        "the session was suspended with its memory: after ResumeSession, reattach (AttachProcess "
        "gives a background process's output from any offset, and follows it); a terminal "
        "(Interact, a PTY) ended with the suspend and is started again",
        reason=Reason.SESSION_NOT_RUNNING,
        metadata={"reattach": "true"},
    )


class WithAgentChannels:
    """`engine` whose start, restore, checkpoint and removal open and close `router`'s
    channels; every other call is the engine's own."""

    def __init__(self, engine: Engine, router: AgentRouter) -> None:
        self._engine = engine
        self._router = router

    @property
    def disks(self) -> Disks:
        return self._engine.disks

    @property
    def agent_port(self) -> AgentAttach | None:
        return self._engine.agent_port

    async def ping(self) -> str:
        return await self._engine.ping()

    async def image_exists(self, image: str) -> bool:
        return await self._engine.image_exists(image)

    async def isolation_tiers(self) -> frozenset[Isolation]:
        return await self._engine.isolation_tiers()

    # ----- sandboxes: the channels follow ----------------------------------------------

    def sandbox_shape(self, request: SandboxRequest) -> str:
        return self._engine.sandbox_shape(request)

    async def create_sandbox(self, request: SandboxRequest) -> str:
        return await self._engine.create_sandbox(request)

    async def set_cpu_shares(self, sandbox_id: str, shares: int, cpu_millis: int = 0) -> None:
        await self._engine.set_cpu_shares(sandbox_id, shares, cpu_millis)

    def cpu_in_place(self, isolation: Isolation) -> bool:
        return self._engine.cpu_in_place(isolation)

    async def start_sandbox(self, sandbox_id: str) -> None:
        await self._engine.start_sandbox(sandbox_id)
        await self._router.open(sandbox_id)  # its agent answers, or the start failed

    async def remove_sandbox(self, sandbox_id: str) -> None:
        await self._router.forget(sandbox_id)
        await self._engine.remove_sandbox(sandbox_id)

    async def inspect_sandbox(
        self, sandbox_id: str, expected: SandboxRequest | None = None
    ) -> SandboxStatus | None:
        return await self._engine.inspect_sandbox(sandbox_id, expected)

    async def list_sandboxes(self, owner_id: str) -> list[SandboxInfo]:
        return await self._engine.list_sandboxes(owner_id)

    async def memory_checkpoints(self) -> str:
        return await self._engine.memory_checkpoints()

    async def checkpoint_sandbox(self, sandbox_id: str, name: str) -> None:
        self._router.checkpointing(sandbox_id, suspended)  # told to reattach; no rescue
        try:
            await self._engine.checkpoint_sandbox(sandbox_id, name)
        except BaseException:
            status = await self._engine.inspect_sandbox(sandbox_id)
            if status is not None and status.running:
                self._router.checkpointing(sandbox_id, None)  # it runs on as it was
            raise
        await self._router.forget(sandbox_id)  # its attach ended with it

    def read_checkpoint(self, sandbox_id: str, name: str) -> AsyncIterator[bytes]:
        return self._engine.read_checkpoint(sandbox_id, name)

    async def restore_sandbox(
        self, sandbox_id: str, name: str, chunks: AsyncIterator[bytes]
    ) -> None:
        await self._engine.restore_sandbox(sandbox_id, name, chunks)
        await self._router.open(sandbox_id)  # the same agent, in memory: a new epoch

    # ----- everything else: the engine's own ------------------------------------------

    async def commit_sandbox(
        self, sandbox_id: str, repository: str, tag: str, labels: Mapping[str, str]
    ) -> str:
        return await self._engine.commit_sandbox(sandbox_id, repository, tag, labels)

    async def remove_work_leftovers(self, owner_id: str) -> list[str]:
        return await self._engine.remove_work_leftovers(owner_id)

    async def remove_image(self, image: str) -> None:
        await self._engine.remove_image(image)

    async def list_images(self, owner_id: str) -> list[str]:
        return await self._engine.list_images(owner_id)

    async def list_networks(self, owner_id: str) -> list[NetworkInfo]:
        return await self._engine.list_networks(owner_id)

    async def remove_network(self, network_id: str) -> None:
        await self._engine.remove_network(network_id)

    async def sandbox_stats(self, sandbox_id: str) -> SandboxStats:
        return await self._engine.sandbox_stats(sandbox_id)

    def oom_kills(self, owner_id: str) -> AsyncIterator[str]:
        return self._engine.oom_kills(owner_id)

    async def inspect_image(self, image: str) -> ImageDetails | None:
        return await self._engine.inspect_image(image)

    def pull_image(
        self, reference: str, auth: Mapping[str, str] | None = None
    ) -> AsyncIterator[PullProgress]:
        return self._engine.pull_image(reference, auth)

    def build_image(
        self,
        context: Path,
        *,
        dockerfile: str,
        tag: str,
        labels: Mapping[str, str],
        limits: BuildLimits,
    ) -> AsyncGenerator[str, None]:
        return self._engine.build_image(
            context, dockerfile=dockerfile, tag=tag, labels=labels, limits=limits
        )

    async def prune_images(self, labels: Mapping[str, str]) -> None:
        await self._engine.prune_images(labels)

    async def build_usage(self, labels: Mapping[str, str]) -> int:
        return await self._engine.build_usage(labels)
