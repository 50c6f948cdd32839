"""Previews assembled for `server.serve`: the parts a session-end hook needs first (before the
SessionManager exists), then the domain API and, when `preview_listen` is set, the listener."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from sandboxd import domain_events
from sandboxd.agent.router import AgentRouter
from sandboxd.audit.events import AuditEvent
from sandboxd.commands import SandboxCommands
from sandboxd.config import Config
from sandboxd.errors import ConfigError
from sandboxd.models import SessionState
from sandboxd.previews.agent_dial import AgentDialer
from sandboxd.previews.connections import OpenConnections
from sandboxd.previews.dialer import ExecDialer, PortDialer
from sandboxd.previews.listener import PreviewListener, tls_context
from sandboxd.previews.metrics import PreviewMetrics
from sandboxd.previews.publishing import Address, Previews
from sandboxd.previews.registry import PortRegistry
from sandboxd.previews.tokens import TokenSigner, load_key
from sandboxd.sessions import SessionManager
from sandboxd.store import SessionStore


@dataclass
class PreviewParts:
    registry: PortRegistry
    signer: TokenSigner
    connections: OpenConnections
    address: Address = field(default_factory=Address)

    async def end_session(self, session_id: str) -> None:
        """Session-end hook: its ports unpublished, their connections cut."""
        await self.registry.remove_session(session_id)
        self.connections.cut(session_id)
        self.connections.forget(session_id)


async def prepare(config: Config, store: SessionStore) -> PreviewParts:
    """The registry (ports of sessions that did not survive a restart forgotten), the key."""
    registry = await PortRegistry(store.db).open()
    for session_id in await registry.sessions():
        session = await store.get(session_id)
        if session is None or session.state is not SessionState.RUNNING:
            await registry.remove_session(session_id)
    settings = config.previews
    return PreviewParts(
        registry,
        TokenSigner(load_key(config.server.data_dir)),
        OpenConnections(settings.max_connections, settings.max_bytes),
    )


@contextlib.asynccontextmanager
async def serve(
    parts: PreviewParts,
    config: Config,
    *,
    commands: SandboxCommands,
    router: AgentRouter | None,
    store: SessionStore,
    sessions: SessionManager,
    metrics_registry: CollectorRegistry,
    audit: Callable[[AuditEvent], None],
    dialer: PortDialer | None = None,
    observer: domain_events.Observer = domain_events.SILENT,
) -> AsyncIterator[Previews]:
    settings = config.previews
    previews = Previews(
        settings,
        sessions,
        parts.registry,
        parts.signer,
        parts.connections,
        parts.address,
        observer,
    )
    if not settings.listen:
        yield previews
        return
    try:
        tls = tls_context(config.tenancy.tls_cert, config.tenancy.tls_key)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"preview listener: cannot load tls_cert/tls_key: {exc}") from None
    listener = PreviewListener(
        settings,
        registry=parts.registry,
        signer=parts.signer,
        connections=parts.connections,
        dialer=dialer or dialer_for(router, commands),
        store=store,
        metrics=PreviewMetrics(metrics_registry),
        audit=audit,
        address=parts.address,
        tls=tls,
    )
    try:
        await listener.__aenter__()
    except OSError as exc:
        raise ConfigError(f"cannot listen for previews on {settings.listen}: {exc}") from None
    try:
        yield previews
    finally:
        await listener.__aexit__(None, None, None)


def dialer_for(router: AgentRouter | None, commands: SandboxCommands) -> PortDialer:
    """The agent's `dial` streams when the sandboxes have agent channels (`router`), falling
    back to `sbx dial` as a sandbox command for a sandbox without one."""
    exec_dialer = ExecDialer(commands)
    return AgentDialer(router.open, exec_dialer) if router is not None else exec_dialer
