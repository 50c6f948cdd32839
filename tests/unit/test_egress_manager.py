"""The egress manager without networks, on the engine fake (no Docker): an ALLOWLIST session's
sandbox gets the proxy variables and the agent's port, its proxy exists before the sandbox
starts and goes with the session, a restart brings proxies back before anything opens the
agents' channels (so their HELLO carries the port) and opens them, and without an agent
channel ALLOWLIST is refused. The engine is never asked for a network."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeArchive, FakeCommands, FakeEngine
from sandboxd.commands import Plain, SandboxCommand, Where
from sandboxd.egress.manager import EgressManager, FilterMode
from sandboxd.errors import FailedPrecondition
from sandboxd.models import NetworkMode, NetworkPolicy
from sandboxd.reasons import Reason
from sandboxd.sessions import recovery
from sandboxd.sessions.spec import CreateSessionInput
from session_stack import session_stack

ALLOW = NetworkPolicy(
    mode=NetworkMode.ALLOWLIST, allowed_domains=("up.test",), allowed_ports=(443,)
)


class Channels:
    """The agents' channel opener: records which sandbox was opened and what HELLO would say."""

    def __init__(self) -> None:
        self.egress: EgressManager | None = None
        self.opened: list[tuple[str, int]] = []

    async def __call__(self, sandbox_id: str) -> None:
        """A channel is opened once per sandbox; its HELLO says the port of that moment."""
        assert self.egress is not None
        if sandbox_id not in [o[0] for o in self.opened]:
            self.opened.append((sandbox_id, self.egress.egress_port("a1")))  # the session tested


class ChannelCommands(FakeCommands):
    """As the server's commands: a command opens the sandbox's agent channel first."""

    channels: Channels | None = None

    @contextlib.asynccontextmanager
    async def open(
        self, where: Where, command: SandboxCommand, *, stdin: bool = False
    ) -> AsyncIterator[Any]:
        if self.channels is not None:
            await self.channels(where.container_id)
        async with super().open(where, command, stdin=stdin) as stream:
            yield stream


class TidyingArchive(FakeArchive):
    """As the real one: tidying a workspace after a restart runs a command in the sandbox."""

    def __init__(self, engine: FakeEngine, commands: FakeCommands) -> None:
        super().__init__(engine)
        self._commands = commands

    async def tidy(self, session: Any) -> None:
        where = Where(session.container_id, "1000:1000")
        async with self._commands.open(where, Plain(("true",))) as s:
            await s.read()


def manager(commands: FakeCommands, channels: Channels | None) -> EgressManager:
    egress = EgressManager(commands, "sbxunit", proxy_port=4128, channels=channels)
    if channels is not None:
        channels.egress = egress
    if isinstance(commands, ChannelCommands):
        commands.channels = channels
    return egress


async def test_allowlist_sandbox_has_no_network_and_its_proxy_lives_with_the_session(
    tmp_path: Path,
) -> None:
    engine = FakeEngine()
    commands = FakeCommands(engine)
    async with (
        manager(commands, Channels()) as egress,
        session_stack(tmp_path, engine=engine, commands=commands, egress=egress) as st,
    ):
        assert egress.filter_mode is FilterMode.NO_NETWORK
        a = await st.sessions.create(CreateSessionInput(session_id="a1", network=ALLOW))
        d = await st.sessions.create(CreateSessionInput(session_id="d1"))
        req = engine.sandboxes[a.container_id].request
        assert req.egress_port == 4128
        assert engine.sandboxes[d.container_id].request.egress_port == 0
        assert egress.egress_port("a1") == 4128 and egress.acceptor("a1") is not None
        assert egress.egress_port("d1") == 0 and egress.acceptor("d1") is None
        await st.sessions.delete("a1")
        assert egress.egress_port("a1") == 0 and egress.acceptor("a1") is None
        assert not [c for c in engine.calls if "network" in c]


async def test_a_restart_brings_proxies_back_before_opening_the_channels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FakeEngine()
    commands = ChannelCommands(engine)
    async with (
        manager(commands, Channels()) as egress,
        session_stack(tmp_path, engine=engine, commands=commands, egress=egress) as st,
    ):
        a = await st.sessions.create(CreateSessionInput(session_id="a1", network=ALLOW))
    channels = Channels()
    # The next server starts later: the session is one of an earlier server, tidied first.
    later = datetime.now(tz=UTC) + timedelta(hours=1)
    monkeypatch.setattr(recovery, "now", lambda: later)
    async with (
        manager(commands, channels) as again,
        session_stack(
            tmp_path,
            engine=engine,
            commands=commands,
            egress=again,
            archive=lambda e: TidyingArchive(e, commands),
        ) as st,
    ):
        await st.sessions.reconcile()
        await again.settled()
        assert again.acceptor("a1") is not None
        # Opened (by reconcile tidying the workspace, or by the egress reconcile) once the
        # proxy was there: its HELLO carries the port.
        assert channels.opened and channels.opened[0] == (a.container_id, 4128)


async def test_without_an_agent_channel_allowlist_is_refused(tmp_path: Path) -> None:
    engine = FakeEngine()
    commands = FakeCommands(engine)
    async with (
        manager(commands, None) as egress,
        session_stack(tmp_path, engine=engine, commands=commands, egress=egress) as st,
    ):
        assert egress.filter_mode is FilterMode.UNAVAILABLE
        with pytest.raises(FailedPrecondition) as refused:
            await st.sessions.create(CreateSessionInput(session_id="a1", network=ALLOW))
        assert refused.value.reason == Reason.EGRESS_UNAVAILABLE
        assert not engine.sandboxes
