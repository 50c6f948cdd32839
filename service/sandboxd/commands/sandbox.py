"""The one owner of every sandbox command: over the sandbox's agent channel when it has one
and the agent runs as the command's user, else the engine's own exec (`EngineExec`).

The agent path is the hot one (a Run over the channel is several times faster than an exec):
one router lookup per command and nothing else added. `sandbox_side` is how the server (and
the engine tests) assemble an engine's sandbox side: the router over its `AgentAttach`, the
lifecycle that keeps the channels in step, and these commands.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from opentelemetry.trace import Tracer

from sandboxd.agent.router import AgentRouter, ChannelSettings, ChannelShares
from sandboxd.commands.argv import argv_of, env_of
from sandboxd.commands.detached import AgentProcesses
from sandboxd.commands.lifecycle import WithAgentChannels
from sandboxd.commands.types import (
    DetachedExecs,
    SandboxCommand,
    Supervised,
    Where,
)
from sandboxd.engine.protocol import Engine, EngineExec, ExecRequest, ExecStatus, ExecStream
from sandboxd.errors import NotFound, Unavailable
from sandboxd.reasons import Reason
from sandboxd.tracing import traced


def exec_request(where: Where, command: SandboxCommand, *, stdin: bool) -> ExecRequest:
    """`command` as the request every runner takes (agent channel, engine exec)."""
    supervised = command if isinstance(command, Supervised) else None
    return ExecRequest(
        argv_of(command),
        user=where.user,
        env=env_of(command),
        stdin=stdin,
        tty=supervised is not None and supervised.pty is not None,
        stdin_ends=stdin and supervised is not None and supervised.stdin_ends,
    )


class AgentFirstCommands:
    """`SandboxCommands` over the router's channels, falling back to `EngineExec`."""

    def __init__(
        self,
        engine: Engine,
        exec_: EngineExec,
        router: AgentRouter | None,
    ) -> None:
        self._engine = engine  # whether a sandbox still runs, when its channel ends
        self._exec = exec_
        self._router = router
        self._detached = AgentProcesses(router) if router is not None else None

    @property
    def detached(self) -> DetachedExecs | None:
        return self._detached

    @contextlib.asynccontextmanager
    async def open(
        self, where: Where, command: SandboxCommand, *, stdin: bool = False
    ) -> AsyncIterator[ExecStream]:
        request = exec_request(where, command, stdin=stdin)
        router = self._router
        channel = await router.serves(where.container_id, where.user) if router else None
        if router is None or channel is None:
            async with self._exec.exec(where.container_id, request) as stream:
                yield stream
            return
        try:
            async with router.exec(where.container_id, channel, request) as agent_stream:
                yield agent_stream
        except Unavailable as exc:
            # The pipe ended under it because the sandbox stopped: the session's loss (what
            # the engine's exec would say: the object is gone), not the agent's.
            if exc.reason == Reason.AGENT_RESTARTED and not await self._running(where):
                raise NotFound(
                    f"container {where.container_id[:12]} stopped",
                    reason=Reason.ENGINE_OBJECT_NOT_FOUND,
                ) from exc
            raise

    async def _running(self, where: Where) -> bool:
        status = await self._engine.inspect_sandbox(where.container_id)
        return status is not None and status.running

    async def resize(self, exec_id: str, rows: int, cols: int) -> None:
        if self._router is not None and self._router.owns(exec_id):
            self._router.resize(exec_id, rows, cols)
            return
        await self._exec.exec_resize(exec_id, rows, cols)

    async def status(self, exec_id: str) -> ExecStatus:
        if self._router is not None and self._router.owns(exec_id):
            return self._router.inspect(exec_id)
        return await self._exec.exec_status(exec_id)


@dataclass(frozen=True)
class SandboxSide:
    """An engine's sandbox side as the domain uses it."""

    engine: Engine  # the lifecycle (channels kept in step when the sandboxes run an agent)
    commands: AgentFirstCommands
    router: AgentRouter | None  # None: the engine's sandboxes run no agent

    async def close(self) -> None:
        """Close the channels (before the engine they attach through)."""
        if self.router is not None:
            await self.router.close()


def sandbox_side(
    engine: Engine,
    exec_: EngineExec,
    settings: ChannelSettings | None = None,
    *,
    shares: ChannelShares | None = None,
    tracer: Tracer | None = None,
) -> SandboxSide:
    """The router over `engine.agent_port` (none when the engine has no agent), the lifecycle
    that opens and closes its channels, and the commands over both; with `tracer`, each of
    the router's calls a span (`agent.<method>`)."""
    port = engine.agent_port
    if port is None:
        return SandboxSide(engine, AgentFirstCommands(engine, exec_, None), None)
    router = AgentRouter(port, settings, shares=shares)
    if tracer is not None:
        router = traced(router, tracer, "agent")
    lifecycle = WithAgentChannels(engine, router)
    return SandboxSide(lifecycle, AgentFirstCommands(lifecycle, exec_, router), router)
