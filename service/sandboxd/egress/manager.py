"""The egress manager: the proxies of ALLOWLIST sessions, served over the agents' channels.

Owned by the server (entered into its AsyncExitStack). A session has no network interface at
all, ALLOWLIST or not (network mode none, only loopback): the in-sandbox agent listens on the
sandbox's 127.0.0.1:`proxy_port` (HTTP(S)_PROXY point there) and carries each connection as an
`egress` stream over its channel (docs/agent.md); the channel hands the stream to the proxy of
the session its container is labelled with. So no Docker network, bridge or host filter exists
to make, protect or clean up; `prepare` and `release` are the proxy's, `reconcile` brings the
proxies of live sessions back after a restart (and opens their channels, so a process that
outlived the server has its egress back without a call).
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType

from sandboxd.commands import SandboxCommands
from sandboxd.egress.addresses import Protected
from sandboxd.egress.audit import AuditLog, EgressSink
from sandboxd.egress.policy import ResolvedQuotas
from sandboxd.egress.proxy import EgressProxy, Rules
from sandboxd.egress.resolver import Resolver
from sandboxd.egress.target import TargetError, normalize_name
from sandboxd.errors import ConfigError, FailedPrecondition, SandboxError
from sandboxd.helper_client import HelperClient
from sandboxd.models import NetworkMode, NetworkPolicy, Session, SessionState
from sandboxd.reasons import Reason
from sandboxd.secrets.setup import SecretsSetup

log = logging.getLogger(__name__)

# Opens (or finds) the agent channel of a sandbox by its id.
ChannelOpener = Callable[[str], Awaitable[object]]


class FilterMode(enum.StrEnum):
    """How sandboxes reach the proxy (GetServerInfo reports it)."""

    NO_NETWORK = "NO_NETWORK"  # no interface but loopback; egress over the agent's channel
    UNAVAILABLE = "UNAVAILABLE"  # no agent channel: ALLOWLIST sessions are refused


def parse_static_hosts(text: str) -> dict[str, tuple[str, ...]]:
    """`name=address,name=address,...` (a name may repeat) -> {normalized name: addresses}."""
    hosts: dict[str, list[str]] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, address = item.partition("=")
        if not sep:
            raise ConfigError(f"proxy_hosts entry {item!r}: expected name=address")
        try:
            key = normalize_name(name.strip())
            addr = str(ipaddress.ip_address(address.strip()))
        except (TargetError, ValueError) as exc:
            raise ConfigError(f"proxy_hosts entry {item!r}: {exc}") from None
        hosts.setdefault(key, []).append(addr)
    return {k: tuple(v) for k, v in hosts.items()}


def _rules(policy: NetworkPolicy, granted: bool) -> Rules:
    """The proxy's rules: private networks only when asked for AND granted to the tenant."""
    return Rules(
        domains=tuple(policy.allowed_domains),
        ports=frozenset(policy.allowed_ports),
        allow_private_networks=policy.allow_private_networks and granted,
    )


class EgressManager:
    def __init__(
        self,
        commands: SandboxCommands,
        owner_id: str,
        *,
        proxy_port: int = 3128,
        channels: ChannelOpener | None = None,
        on_decision: Callable[[bool], None] | None = None,
        on_event: EgressSink | None = None,
        resolver: Resolver | None = None,
        protected: Protected | None = None,
        private_networks_granted: Callable[[str], bool] = lambda tenant: False,
        secrets: SecretsSetup | None = None,
    ) -> None:
        self._secrets = secrets or SecretsSetup()
        self._helper = HelperClient(commands)  # the trust of the secrets' interceptor
        self._on_decision = on_decision
        self._on_event = on_event
        self._owner_id = owner_id
        self.port = proxy_port  # where each sandbox's agent listens, on its loopback
        self._channels = channels
        self._resolver = resolver or Resolver()
        self._protected = protected or Protected()
        # tenant -> may its sessions reach private networks (the operator's grant)
        self._granted = private_networks_granted
        self._tenants: dict[str, str] = {}  # session id -> tenant, for policy updates
        self._proxies: dict[str, EgressProxy] = {}
        self._audit: dict[str, AuditLog] = {}
        self._opening: set[asyncio.Task[None]] = set()  # channels opened after a restart
        self.filter_mode = FilterMode.NO_NETWORK if channels else FilterMode.UNAVAILABLE

    async def __aenter__(self) -> EgressManager:
        if self.filter_mode is FilterMode.UNAVAILABLE:
            log.warning("egress: the agent is off (setting agent); ALLOWLIST sessions are refused")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for task in list(self._opening):
            task.cancel()
        if self._opening:
            await asyncio.gather(*self._opening, return_exceptions=True)
        for proxy in list(self._proxies.values()):
            await proxy.close()
        self._proxies.clear()
        self._resolver.close()

    def require_available(self) -> None:
        if self.filter_mode is FilterMode.UNAVAILABLE:
            raise FailedPrecondition(
                "network.mode ALLOWLIST needs the in-sandbox agent, which carries the "
                "sandbox's egress over its channel (the server runs with the setting agent off)",
                reason=Reason.EGRESS_UNAVAILABLE,
            )

    def audit(self, session_id: str) -> AuditLog | None:
        return self._audit.get(session_id)

    def proxy(self, session_id: str) -> EgressProxy | None:
        return self._proxies.get(session_id)

    def bytes_moved(self, session_id: str) -> int:
        """Bytes the session's proxy carried, both ways, since it (re)started."""
        proxy = self._proxies.get(session_id)
        return proxy.budget.used["up"] + proxy.budget.used["down"] if proxy else 0

    # ----- what the agent channels ask (sandboxd.agent.egress_route.EgressEndpoints) -------

    def egress_port(self, session_id: str) -> int:
        """The port the agent of `session_id` listens on (HELLO's egress_port); 0: none."""
        return self.port if session_id in self._proxies else 0

    def acceptor(self, session_id: str) -> EgressProxy | None:
        """Whom an `egress` stream of that session's agent goes to; None: refused."""
        return self._proxies.get(session_id)

    # ----- a session's proxy --------------------------------------------------------------

    async def prepare(self, session: Session) -> int:
        """The proxy of an ALLOWLIST session, ready before its sandbox starts (the agent's
        channel asks for it at its first HELLO); idempotent (restart, resume, retry). The
        port the agent listens on."""
        self.require_available()
        sid = session.session_id
        policy = session.spec.network
        self._tenants[sid] = session.tenant
        rules = _rules(policy, self._granted(session.tenant))
        existing = self._proxies.get(sid)
        if existing is not None:
            existing.rules = rules
            return self.port
        audit = self._audit.setdefault(
            sid,
            AuditLog(
                sid,
                on_decision=self._on_decision,
                on_secret=self._secrets.counter(session.tenant),
                on_event=self._on_event,
                tenant=session.tenant,
            ),
        )
        self._proxies[sid] = EgressProxy(
            sid,
            rules,
            ResolvedQuotas.of(policy.quotas),
            self._resolver,
            audit,
            protected=self._protected,
            interceptor=self._secrets.interceptor(sid, session.tenant, policy),
            tenant=session.tenant,
        )
        log.info("egress proxy of %s up (agent port %d)", sid, self.port)
        return self.port

    def update(self, session_id: str, policy: NetworkPolicy) -> None:
        """New rules for new connections; open tunnels keep what they were allowed."""
        proxy = self._proxies.get(session_id)
        if proxy is not None:
            tenant = self._tenants.get(session_id, "")
            proxy.rules = _rules(policy, bool(tenant) and self._granted(tenant))
            proxy.quotas = ResolvedQuotas.of(policy.quotas)
            if proxy.interceptor is not None:
                proxy.interceptor.update(policy.secrets, policy.refuse_misdirected_secrets)

    async def install_trust(self, session: Session) -> None:
        """The session CA into a started sandbox that has secrets (its proxy draws the CA)."""
        proxy = self._proxies.get(session.session_id)
        if proxy is not None and proxy.interceptor is not None and session.container_id:
            await proxy.interceptor.install_trust(self._helper, session.container_id)

    async def release(self, session_id: str, *, keep_audit: bool = False) -> None:
        """Close the proxy (its open tunnels are cut); the audit stays when asked."""
        proxy = self._proxies.pop(session_id, None)
        self._tenants.pop(session_id, None)
        if proxy is not None:
            await proxy.close()
        if not keep_audit:
            self._audit.pop(session_id, None)

    async def reconcile(
        self,
        load: Callable[[str], Awaitable[Session | None]],
        locked: Callable[[str], AbstractAsyncContextManager[None]],
        session_ids: Sequence[str],
    ) -> None:
        """Proxies back for live ALLOWLIST sessions, and their agents' channels open; proxies
        no session claims any more closed.

        Runs beside live calls: each decision is taken under the session's lock on a fresh
        read, so a delete or create in progress is never undone.
        """
        for sid in sorted((set(self._proxies) | set(session_ids)) - {""}):
            async with locked(sid):
                session = await load(sid)
                wanted = (
                    session is not None
                    and session.spec.network.mode is NetworkMode.ALLOWLIST
                    and session.state in (SessionState.RUNNING, SessionState.CREATING)
                )
                if session is None or not wanted:
                    if sid in self._proxies:
                        log.info("egress: closing the proxy of %s (no longer claimed)", sid)
                        await self.release(sid, keep_audit=session is not None)
                    continue
                if session.state is SessionState.RUNNING and sid not in self._proxies:
                    try:
                        await self.prepare(session)
                        # Before the server serves a call: a new CA since the restart (its
                        # command opens the agent's channel too).
                        await self.install_trust(session)
                    except SandboxError as exc:
                        log.warning("egress: cannot restore the proxy of %s: %s", sid, exc)
                        continue
                    self._open_channel(session)

    def _open_channel(self, session: Session) -> None:
        """The agent listens (and carries egress) only while its channel is open: open it in
        a task of its own (an agent that does not answer holds up neither start-up nor other
        sessions)."""
        if self._channels is None or not session.container_id:
            return
        channels = self._channels

        async def run() -> None:
            try:
                async with asyncio.timeout(60):
                    await channels(session.container_id)
            except (SandboxError, TimeoutError) as exc:
                log.warning("egress: the agent of %s: %s", session.session_id, exc)

        task = asyncio.get_running_loop().create_task(run(), name=f"egress {session.session_id}")
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)

    async def settled(self) -> None:
        """Wait for the channels being opened after a restart (tests, shutdown)."""
        if self._opening:
            await asyncio.gather(*self._opening, return_exceptions=True)
