"""Detached commands over the agent channel (sandboxd.commands.DetachedExecs): background
processes that outlive the server. The agent keeps each one running and its output in a ring
(in the sandbox's memory, not the server's); a server that starts again lists them and attaches
from the oldest byte still held."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack
from typing import Any

from sandboxd.agent.exec_stream import AgentExec
from sandboxd.agent.router import AgentRouter
from sandboxd.commands.argv import argv_of, env_of
from sandboxd.commands.types import Detach, SandboxCommand
from sandboxd.engine.protocol import ExecRequest
from sandboxd.errors import SandboxError

GAP_FD = 16  # sandboxd.execution.GAP_FD (the agent package does not import the domain)
# In a row, with no byte read between: an agent that answers every attach with GAP is broken.
# Not in all: a fast writer's ring wrapped small by the agent's budget (docs/agent.md) overruns
# a live reader again and again, for as long as it writes.
MAX_REATTACH = 1000


class DetachedStream:
    """The output of a detached command as one ExecStream, across the agent's RESET `GAP`: the
    live stream reads the agent's ring, so a command that writes faster than the channel
    carries overruns it. Then the stream attaches again from where it was; OPEN_OK's `start`
    says what the ring lost, and `read` reports it as (fd + GAP_FD, length) before going on."""

    def __init__(
        self,
        router: AgentRouter,
        sandbox_id: str,
        detach_id: str,
        stack: AsyncExitStack,
        offsets: Mapping[int, int] | None = None,
    ) -> None:
        self._router = router
        self._sandbox = sandbox_id
        self._id = detach_id
        self._stack = stack
        self._cur: AgentExec | None = None
        self._offsets = {1: 0, 2: 0} | {fd: max(0, n) for fd, n in (offsets or {}).items()}
        self.start = {1: 0, 2: 0}  # the agent's ring when the stream (last) opened
        self.end = {1: 0, 2: 0}
        self._pending: list[tuple[int, bytes]] = []
        self._reattached = 0
        self.exec_id = ""

    async def attach(self, first: AgentExec | None = None) -> None:
        if first is None:
            offsets = {str(fd): off for fd, off in self._offsets.items()}
            first = await self._stack.enter_async_context(
                self._router.open_kind(
                    self._sandbox, "attach", {"id": self._id, "offsets": offsets}
                )
            )
        self._cur = first
        self.exec_id = self.exec_id or first.exec_id
        start, end = first.opened.get("start"), first.opened.get("end")
        for fd in (1, 2):
            for doc, into in ((start, self.start), (end, self.end)):
                got = doc.get(str(fd)) if isinstance(doc, dict) else None
                into[fd] = got if isinstance(got, int) and got >= 0 else 0
            held = start.get(str(fd)) if isinstance(start, dict) else None
            if isinstance(held, int) and held > self._offsets[fd]:
                self._pending.append((fd + GAP_FD, (held - self._offsets[fd]).to_bytes(8, "big")))
                self._offsets[fd] = held

    def _stream(self) -> AgentExec:
        assert self._cur is not None
        return self._cur

    async def read(self) -> tuple[int, bytes] | None:
        while True:
            if self._pending:
                return self._pending.pop(0)
            try:
                item = await self._stream().read()
            except SandboxError:
                if self._stream().reset_name != "GAP" or self._reattached >= MAX_REATTACH:
                    raise
                self._reattached += 1
                await self.attach()
                continue
            if item is not None and item[0] in self._offsets:
                self._offsets[item[0]] += len(item[1])
                self._reattached = 0
            return item

    async def read_joined(self, limit: int) -> tuple[int, bytes] | None:
        return await self.read()

    async def write(self, data: bytes) -> None:
        await self._stream().write(data)

    def close_stdin(self) -> None:
        self._stream().close_stdin()

    async def close(self) -> None:
        await self._stack.aclose()

    async def exit_code(self) -> int | None:
        return await self._stream().exit_code()

    async def wait_exit_code(self) -> int:
        return await self._stream().wait_exit_code()


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
        command: SandboxCommand,
        *,
        detach: Detach,
    ) -> AsyncIterator[DetachedStream]:
        channel = await self._router.open(container_id)
        if channel is None:
            raise SandboxError("this sandbox has no agent")
        async with AsyncExitStack() as stack:
            first = await stack.enter_async_context(
                self._router.exec(
                    container_id,
                    channel,
                    ExecRequest(argv_of(command), user="", env=env_of(command), stdin=True),
                    detach={
                        "id": detach.detach_id,
                        "buffer": detach.buffer_bytes,
                        **({"budget": detach.budget_bytes} if detach.budget_bytes else {}),
                        **(
                            {"timeout_ms": detach.timeout_ms}
                            if detach.timeout_ms is not None
                            else {}
                        ),
                    },
                )
            )
            stream = DetachedStream(self._router, container_id, detach.detach_id, stack)
            await stream.attach(first)
            yield stream

    @contextlib.asynccontextmanager
    async def attach(
        self, container_id: str, detach_id: str, offsets: Mapping[int, int] | None = None
    ) -> AsyncIterator[DetachedStream]:
        async with AsyncExitStack() as stack:
            stream = DetachedStream(self._router, container_id, detach_id, stack, offsets)
            await stream.attach()
            yield stream

    async def listing(self, container_id: str) -> list[dict[str, Any]]:
        async with self._router.open_kind(container_id, "processes", {}) as stream:
            doc = stream.opened
        procs = doc.get("processes")
        return [p for p in procs if isinstance(p, dict)] if isinstance(procs, list) else []

    async def forget(self, container_id: str, detach_id: str) -> None:
        async with self._router.open_kind(container_id, "forget", {"id": detach_id}):
            pass
