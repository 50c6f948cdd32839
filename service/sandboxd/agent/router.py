"""The server's channels, one per sandbox, and the rescue of an agent that stops answering.

The server builds it over the engine's `AgentAttach` (server/parts.py) and hands it to those
that need a channel: the sandbox commands ask it before every command (sandboxd.commands), the
engine's lifecycle opens and closes channels (`commands/lifecycle.py`). A channel is opened when
its sandbox starts (pool members too), re-opened on first use after a server
restart (the agent's detached processes survive: HELLO_OK lists them), and closed when the
sandbox is removed. A channel that goes LOST (no HELLO_OK within the handshake bound, keepalive
lost) is rescued once at a time: the port kills every process of the sandbox user and wakes the
agent, then a new epoch begins; callers meanwhile get AGENT_UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandboxd.agent.channel import Channel, State
from sandboxd.agent.egress_route import EgressEndpoints, egress_port, peer_open_handler
from sandboxd.agent.exec_stream import AgentExec, exec_request
from sandboxd.agent.port import AgentAttach, Attached, ExecRequest, ExecStatus, Paused
from sandboxd.agent.streams import agent_unavailable
from sandboxd.config_sections import AgentSection
from sandboxd.errors import SandboxError

log = logging.getLogger(__name__)

RESCUE_RETRY_S = 10.0  # a rescue that failed is tried again on use, at most this often
KEPT_EXITS = 4096  # ended execs whose inspect answer is kept (the kill path asks after close)


@dataclass
class _Entry:
    channel: Channel
    user: str
    env: Mapping[str, str]
    rescuing: asyncio.Task[None] | None = None
    rescued_at: float = 0.0
    paused: bool = False
    execs: set[str] = field(default_factory=set)
    tenant: str = ""  # whose share the channel's reads spend ("" not known yet: not paced)


class ChannelShares(Protocol):
    """The tenants' output shares as the router uses them (sandboxd.admission.ChannelShares)."""

    def tenant_of_label(self, session_id: str) -> str:
        """The tenant of a sandbox labelled with `session_id`; "" when it says none."""
        ...

    def calling_tenant(self) -> str:
        """The tenant of the call being served (a sandbox is used only by its own tenant)."""
        ...

    def delay(self, tenant: str, nbytes: int) -> float:
        """Seconds a channel of `tenant` waits before reading again, having read `nbytes`."""
        ...


@dataclass(frozen=True)
class ChannelSettings:
    window: int = 1 << 20
    window_max: int = 8 << 20
    keepalive_s: float = 5.0
    handshake_s: float = 10.0
    resend_s: float = 0.5


def agent_settings(config: _HasAgent) -> ChannelSettings | None:
    """The channel settings of the server's config; None when the agent is turned off."""
    a = config.agent
    if not a.enabled:
        return None
    return ChannelSettings(
        window=a.window,
        window_max=a.window_max,
        keepalive_s=a.keepalive_s,
        handshake_s=a.handshake_s,
    )


class _HasAgent(Protocol):
    @property
    def agent(self) -> AgentSection: ...


class AgentRouter:
    def __init__(
        self,
        port: AgentAttach,
        settings: ChannelSettings | None = None,
        *,
        shares: ChannelShares | None = None,
    ) -> None:
        self._port = port
        self._settings = settings or ChannelSettings()
        self._entries: dict[str, _Entry] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._without: set[str] = set()  # sandboxes whose main process is not the agent
        self._execs: dict[str, AgentExec] = {}
        self._ended: collections.OrderedDict[str, ExecStatus] = collections.OrderedDict()
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        # The server's proxies, given once before any sandbox starts (server/parts.py): the
        # proxies need the channels (opened again after a restart) and a channel its proxy's
        # port (HELLO), so one of the two is given to the other after both are made.
        self.egress: EgressEndpoints | None = None
        # The tenants' output shares (sandboxd.admission); None: channels read as fast as
        # their agents write.
        self.shares = shares

    # ----- channels ------------------------------------------------------------------------

    async def open(self, sandbox_id: str) -> Channel | None:
        """The sandbox's channel, attached and handshaken (None for a sandbox without an
        agent); AGENT_UNAVAILABLE if the agent does not answer (a rescue is then under way)."""
        if sandbox_id in self._without:
            return None
        lock = self._locks.setdefault(sandbox_id, asyncio.Lock())
        async with lock:
            entry = self._entries.get(sandbox_id)
            if entry is not None and entry.channel.state is not State.CLOSED:
                return await self._usable(sandbox_id, entry)
            if entry is not None:
                await self._drop(sandbox_id, entry)
            attached = await self._port.attach(sandbox_id)
            if attached is None:
                self._without.add(sandbox_id)
                return None
            s = self._settings
            channel = Channel(
                attached.transport,
                name=sandbox_id[:12],
                window=s.window,
                window_max=s.window_max,
                keepalive_s=s.keepalive_s,
                handshake_s=s.handshake_s,
                resend_s=s.resend_s,
                on_lost=lambda ch, why: self._lost(sandbox_id, ch, why),
                egress_port=functools.partial(egress_port, self.egress, attached.session_id),
                on_peer_open=peer_open_handler(self.egress, attached.session_id),
                budget=attached.budget,
                guard=attached.guard,
                pace=functools.partial(self._pace, sandbox_id) if self.shares else None,
            )
            entry = _Entry(channel, attached.user, attached.env)
            if self.shares is not None:  # a warm container has no session label: learnt on use
                entry.tenant = self.shares.tenant_of_label(attached.session_id)
            self._entries[sandbox_id] = entry
            try:
                hello = await channel.start()
            except SandboxError:
                self._lost(sandbox_id, channel, channel.why)
                raise
            log.info(
                "agent channel %s open: agent %s (pid %d), %d detached processes",
                sandbox_id[:12],
                hello.instance,
                hello.pid,
                len(hello.processes),
            )
            return channel

    async def _usable(self, sandbox_id: str, entry: _Entry) -> Channel:
        """A LOST channel is rescued now (or the rescue under way awaited) before answering."""
        if entry.channel.state is State.LOST:
            self._lost(sandbox_id, entry.channel, entry.channel.why, now=True)
            if entry.rescuing is not None:
                await asyncio.wait({entry.rescuing}, timeout=self._settings.handshake_s + 15)
            if entry.channel.state is State.LOST:
                raise agent_unavailable(
                    f"the sandbox's agent does not answer ({entry.channel.why}); the server is "
                    "rescuing it, try again shortly"
                )
        await entry.channel.ready()
        return entry.channel

    async def forget(self, sandbox_id: str) -> None:
        """The sandbox is being removed: close its channel."""
        entry = self._entries.pop(sandbox_id, None)
        self._locks.pop(sandbox_id, None)
        self._without.discard(sandbox_id)
        if entry is not None:
            await self._drop(sandbox_id, entry)

    async def _drop(self, sandbox_id: str, entry: _Entry) -> None:
        if entry.rescuing is not None:
            entry.rescuing.cancel()
        for exec_id in entry.execs:
            self._execs.pop(exec_id, None)
        await entry.channel.close()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for sandbox_id in list(self._entries):
            await self.forget(sandbox_id)
        if self._tasks:
            await asyncio.wait(self._tasks)

    def checkpointing(self, sandbox_id: str, ending: Callable[[], SandboxError] | None) -> None:
        """The sandbox is being checkpointed (`ending`: what its streams are told when that
        stops it; no rescue follows), or is no longer (None: the checkpoint did not happen)."""
        entry = self._entries.get(sandbox_id)
        if entry is not None:
            entry.channel.ending = ending

    def _pace(self, sandbox_id: str, nbytes: int) -> float:
        entry = self._entries.get(sandbox_id)
        if entry is None or not entry.tenant or self.shares is None:
            return 0.0
        return self.shares.delay(entry.tenant, nbytes)

    def _learn_tenant(self, sandbox_id: str) -> None:
        """A warm container claimed by a session: its first command names the tenant."""
        entry = self._entries.get(sandbox_id)
        if entry is not None and not entry.tenant and self.shares is not None:
            entry.tenant = self.shares.calling_tenant()

    def state(self, sandbox_id: str) -> State | None:
        entry = self._entries.get(sandbox_id)
        return entry.channel.state if entry is not None else None

    # ----- rescue --------------------------------------------------------------------------

    def _lost(self, sandbox_id: str, channel: Channel, why: str, *, now: bool = False) -> None:
        """Start a rescue unless one runs; on its own (not for a caller: `now`) at most every
        RESCUE_RETRY_S."""
        entry = self._entries.get(sandbox_id)
        if entry is None or entry.channel is not channel or channel.state is not State.LOST:
            return
        if channel.ending is not None:  # checkpointed: stopped on purpose, nothing to rescue
            return
        if entry.rescuing is not None and not entry.rescuing.done():
            return
        if not now and time.monotonic() - entry.rescued_at < RESCUE_RETRY_S:
            return
        entry.rescued_at = time.monotonic()
        task = asyncio.get_running_loop().create_task(self._rescue(sandbox_id, entry, why))
        entry.rescuing = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _rescue(self, sandbox_id: str, entry: _Entry, why: str) -> None:
        log.warning("agent of %s does not answer (%s): rescuing", sandbox_id[:12], why)
        try:
            if entry.paused:
                # It was silent because the engine froze the sandbox: nothing to kill if it
                # answers now.
                entry.paused = False
                with contextlib.suppress(SandboxError):
                    hello = await entry.channel.resync()
                    log.warning("agent of %s answers again after a pause", sandbox_id[:12])
                    return
            done = await self._port.rescue(sandbox_id, entry.user)
            log.warning("agent of %s: %s", sandbox_id[:12], done)
            hello = await entry.channel.resync()
            log.warning("agent of %s answers again (agent %s)", sandbox_id[:12], hello.instance)
        except asyncio.CancelledError:
            raise
        except Paused:
            entry.paused = True
            log.warning("agent of %s: its sandbox is paused; rescued once it runs", sandbox_id[:12])
        except Exception as exc:
            log.error("agent of %s could not be rescued: %s", sandbox_id[:12], exc)

    # ----- commands ------------------------------------------------------------------------

    async def serves(self, sandbox_id: str, user: str) -> Channel | None:
        """The channel for a command as `user`; None when the agent runs as another user
        (then only the engine's own exec can run it)."""
        channel = await self.open(sandbox_id)
        self._learn_tenant(sandbox_id)
        entry = self._entries.get(sandbox_id)
        return channel if channel is not None and entry is not None and entry.user == user else None

    @contextlib.asynccontextmanager
    async def exec(
        self,
        sandbox_id: str,
        channel: Channel,
        request: ExecRequest,
        *,
        detach: dict[str, Any] | None = None,
    ) -> AsyncIterator[AgentExec]:
        """`request.user` is not sent: the agent starts every command as the session's user."""
        entry = self._entries.get(sandbox_id)
        base = entry.env if entry is not None else {}
        opened = exec_request(
            request.argv,
            base_env=base,
            env=request.env,
            workdir=request.workdir,
            stdin=request.stdin,
            tty=request.tty,
        )
        opened["detach"] = detach
        # No stdin to come: its EOF rides in the OPEN's write (one write, one frame through
        # the engine's attach, instead of a second after OPEN_OK).
        eof = (0,) if request.stdin and request.stdin_ends else ()
        async with self._handle(sandbox_id, channel, "exec", opened, eof) as handle:
            yield handle

    @contextlib.asynccontextmanager
    async def open_kind(
        self, sandbox_id: str, kind: str, request: dict[str, Any]
    ) -> AsyncIterator[AgentExec]:
        """A stream of another kind (attach, processes, forget) on the sandbox's channel."""
        channel = await self.open(sandbox_id)
        if channel is None:
            raise agent_unavailable(f"sandbox {sandbox_id[:12]} has no agent")
        self._learn_tenant(sandbox_id)
        async with self._handle(sandbox_id, channel, kind, request) as handle:
            yield handle

    @contextlib.asynccontextmanager
    async def _handle(
        self,
        sandbox_id: str,
        channel: Channel,
        kind: str,
        request: dict[str, Any],
        eof: tuple[int, ...] = (),
    ) -> AsyncIterator[AgentExec]:
        stream = await channel.open(kind, request, eof=eof)
        pid = stream.opened.result().get("pid")
        exec_id = f"agent-{sandbox_id[:12]}-{next(self._ids)}"
        handle = AgentExec(channel, stream, exec_id, pid if isinstance(pid, int) else 0)
        entry = self._entries.get(sandbox_id)
        if entry is not None:
            entry.execs.add(exec_id)
        self._execs[exec_id] = handle
        try:
            yield handle
        finally:
            await handle.close()
            self._execs.pop(exec_id, None)
            if entry is not None:
                entry.execs.discard(exec_id)
            self._ended[exec_id] = handle.inspect()
            while len(self._ended) > KEPT_EXITS:
                self._ended.popitem(last=False)

    def resize(self, exec_id: str, rows: int, cols: int) -> None:
        handle = self._execs.get(exec_id)
        if handle is not None:
            handle.resize(rows, cols)

    def inspect(self, exec_id: str) -> ExecStatus:
        handle = self._execs.get(exec_id)
        if handle is not None:
            return handle.inspect()
        return self._ended.get(exec_id) or ExecStatus(running=False, exit_code=-1)

    @staticmethod
    def owns(exec_id: str) -> bool:
        return exec_id.startswith("agent-")


__all__ = [
    "AgentRouter",
    "Attached",
    "ChannelSettings",
    "ChannelShares",
    "Paused",
    "agent_settings",
]
