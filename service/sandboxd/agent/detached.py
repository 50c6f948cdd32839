"""Detached commands over the agent channel (engine.protocol.DetachedExecs): background
processes that outlive the server. The agent keeps each one running and its output in a ring
(in the sandbox's memory, not the server's); a server that starts again lists them and attaches
from the oldest byte still held."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from sandboxd.agent.exec_stream import AgentExec
from sandboxd.agent.router import AgentRouter
from sandboxd.engine.protocol import Detach
from sandboxd.errors import SandboxError


class AgentProcesses:
    def __init__(self, router: AgentRouter) -> None:
        self._router = router

    async def serves(self, container_id: str, user: str) -> bool:
        try:
            return await self._router.serves(container_id, user) is not None
        except SandboxError:
            return False

    @contextlib.asynccontextmanager
    async def exec(
        self,
        container_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        workdir: str | None,
        detach: Detach,
    ) -> AsyncIterator[AgentExec]:
        channel = await self._router.open(container_id)
        if channel is None:
            raise SandboxError("this sandbox has no agent")
        async with self._router.exec(
            container_id,
            channel,
            argv,
            env=env,
            workdir=workdir,
            stdin=True,
            tty=False,
            detach={"id": detach.detach_id, "buffer": detach.buffer_bytes},
        ) as stream:
            yield stream

    @contextlib.asynccontextmanager
    async def attach(self, container_id: str, detach_id: str) -> AsyncIterator[AgentExec]:
        async with self._router.open_kind(
            container_id, "attach", {"id": detach_id, "offsets": {"1": 0, "2": 0}}
        ) as stream:
            yield stream

    async def listing(self, container_id: str) -> list[dict[str, Any]]:
        async with self._router.open_kind(container_id, "processes", {}) as stream:
            doc = stream.opened
        procs = doc.get("processes")
        return [p for p in procs if isinstance(p, dict)] if isinstance(procs, list) else []

    async def forget(self, container_id: str, detach_id: str) -> None:
        async with self._router.open_kind(container_id, "forget", {"id": detach_id}):
            pass


def for_engine(engine: object) -> AgentProcesses | None:
    """The detached commands of an engine adapter that has agent channels (DockerEngine with
    the agent on); None for others (the unit tests' fake, `agent = false`)."""
    router = getattr(engine, "agents", None)
    return AgentProcesses(router) if isinstance(router, AgentRouter) else None
