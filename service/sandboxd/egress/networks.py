"""The egress manager: per-session Internal networks, their host filters and proxies.

Owned by the server (entered into its AsyncExitStack). For an ALLOWLIST session it creates the
network `sandboxd-net-<owner>-<session>` (labelled like containers), installs the bridge filter,
and starts the session's proxy on the gateway address; `release` undoes all three. Networks and
filters outlive a server restart (the containers stay attached and stay filtered while no proxy
listens: fail closed); `reconcile` brings the proxies back and removes what no session claims.
"""

from __future__ import annotations

import enum
import hashlib
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType

from sandboxd.egress import firewall
from sandboxd.egress.addresses import Protected
from sandboxd.egress.audit import AuditLog, EgressSink
from sandboxd.egress.policy import ResolvedQuotas
from sandboxd.egress.proxy import EgressProxy, Rules
from sandboxd.egress.resolver import Resolver
from sandboxd.egress.target import TargetError, normalize_name
from sandboxd.engine.docker_profile import NO_PROXY, apply_to_container
from sandboxd.engine.protocol import Engine, SessionNetwork
from sandboxd.errors import ConfigError, FailedPrecondition, Internal, SandboxError
from sandboxd.helper_client import HelperClient
from sandboxd.labels import LABEL_FINGERPRINT, LABEL_OWNER, LABEL_SESSION
from sandboxd.models import NetworkMode, NetworkPolicy, Session, SessionState
from sandboxd.reasons import Reason
from sandboxd.secrets.setup import SecretsSetup

log = logging.getLogger(__name__)

# The container side of a session network is the engine adapter's (re-exported for callers).
__all__ = [
    "NO_PROXY",
    "EgressManager",
    "FilterMode",
    "SessionNetwork",
    "apply_to_container",
    "bridge_name",
    "network_name",
    "parse_static_hosts",
]


class FilterMode(enum.StrEnum):
    """How the host side of a session network is protected (GetServerInfo reports it)."""

    IPTABLES = "IPTABLES"  # only the proxy port is reachable from a session network
    UNFILTERED = "UNFILTERED"  # no filter could be installed; the operator accepted that
    UNAVAILABLE = "UNAVAILABLE"  # no filter, not accepted: ALLOWLIST sessions are refused


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


def network_name(owner_id: str, session_id: str) -> str:
    return f"sandboxd-net-{owner_id}-{session_id}"


def bridge_name(owner_id: str, session_id: str) -> str:
    """A Linux interface name (at most 15 bytes) that is stable across restarts."""
    return "sbx" + hashlib.sha256(f"{owner_id}/{session_id}".encode()).hexdigest()[:12]


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
        engine: Engine,
        owner_id: str,
        *,
        proxy_port: int = 3128,
        static_hosts: dict[str, tuple[str, ...]] | None = None,
        allow_unfiltered: bool = False,
        on_decision: Callable[[bool], None] | None = None,
        on_event: EgressSink | None = None,
        resolver: Resolver | None = None,
        protected: Protected | None = None,
        private_networks_granted: Callable[[str], bool] = lambda tenant: False,
        secrets: SecretsSetup | None = None,
        local_engine: bool = True,
    ) -> None:
        self._engine = engine
        self._local_engine = local_engine
        self._secrets = secrets or SecretsSetup()
        self._helper = HelperClient(engine)
        self._on_decision = on_decision
        self._on_event = on_event
        self._owner_id = owner_id
        self._port = proxy_port
        self._resolver = resolver or Resolver(static_hosts)
        self._protected = protected or Protected()
        # tenant -> may its sessions reach private networks (the operator's grant)
        self._granted = private_networks_granted
        self._tenants: dict[str, str] = {}  # session id -> tenant, for policy updates
        self._allow_unfiltered = allow_unfiltered
        self._proxies: dict[str, EgressProxy] = {}
        self._audit: dict[str, AuditLog] = {}
        self.filter_mode = FilterMode.UNAVAILABLE
        self.filter_problem = ""

    async def __aenter__(self) -> EgressManager:
        if not self._local_engine:
            # Each proxy listens on its session network's gateway, an address of the engine's
            # host, and the filter is this host's iptables: neither exists for a remote engine
            # (egress moves onto the agent's channel, which needs neither).
            self.filter_problem = "the Docker engine is remote (tcp://)"
            log.warning("egress: %s; ALLOWLIST sessions are refused", self.filter_problem)
            return self
        ok, problem = await firewall.available()
        if ok:
            self.filter_mode = FilterMode.IPTABLES
        else:
            self.filter_problem = problem
            self.filter_mode = (
                FilterMode.UNFILTERED if self._allow_unfiltered else FilterMode.UNAVAILABLE
            )
            log.warning(
                "egress: no host filter (%s); ALLOWLIST sessions are %s",
                problem,
                "allowed UNFILTERED (operator opt-in)" if self._allow_unfiltered else "refused",
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Networks and filters stay: attached containers remain cut off until a restart.
        for proxy in list(self._proxies.values()):
            await proxy.close()
        self._proxies.clear()
        self._resolver.close()

    def require_available(self) -> None:
        if not self._local_engine:
            raise FailedPrecondition(
                "network.mode ALLOWLIST needs a local Docker engine for now: its proxy listens "
                "on the session network's gateway on the engine's host, and this server's "
                "engine is remote (tcp://)",
                reason=Reason.EGRESS_UNAVAILABLE,
            )
        if self.filter_mode is FilterMode.UNAVAILABLE:
            raise FailedPrecondition(
                "network.mode ALLOWLIST needs a host filter (iptables) this server cannot "
                f"install ({self.filter_problem}); the operator may opt into the weaker "
                "unfiltered mode with egress_allow_unfiltered",
                reason=Reason.EGRESS_UNAVAILABLE,
            )

    def audit(self, session_id: str) -> AuditLog | None:
        return self._audit.get(session_id)

    def proxy(self, session_id: str) -> EgressProxy | None:
        return self._proxies.get(session_id)

    async def prepare(self, session: Session) -> SessionNetwork:
        """Network, filter and proxy of a session; idempotent (restart, resume, retry)."""
        self.require_available()
        sid = session.session_id
        name = network_name(self._owner_id, sid)
        bridge = bridge_name(self._owner_id, sid)
        address = await self._engine.ensure_network(
            name,
            {
                LABEL_OWNER: self._owner_id,
                LABEL_SESSION: sid,
                LABEL_FINGERPRINT: session.fingerprint,
            },
            bridge,
        )
        gateway = address.gateway
        subnet = ipaddress.ip_network(address.subnet, strict=False)
        if self.filter_mode is FilterMode.IPTABLES:
            try:
                await firewall.install(bridge, gateway, self._port)
            except firewall.FirewallError as exc:
                raise Internal(f"could not install the egress filter of {name}: {exc}") from exc
        self._protected.refresh()  # the new gateway is one of the host's addresses now
        net = SessionNetwork(name, gateway, f"http://{gateway}:{self._port}")
        policy = session.spec.network
        self._tenants[sid] = session.tenant
        rules = _rules(policy, self._granted(session.tenant))
        existing = self._proxies.get(sid)
        if existing is not None:
            existing.rules = rules
            return net
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
        proxy = EgressProxy(
            sid,
            rules,
            ResolvedQuotas.of(policy.quotas),
            self._resolver,
            audit,
            peer_network=subnet,
            protected=self._protected,
            interceptor=self._secrets.interceptor(sid, session.tenant, policy),
        )
        try:
            await proxy.start(gateway, self._port)
        except OSError as exc:
            raise Internal(
                f"egress proxy of {sid} cannot listen on {net.proxy_url}: {exc}"
            ) from exc
        self._proxies[sid] = proxy
        log.info("egress proxy of %s up at %s", sid, net.proxy_url)
        return net

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
        """Close the proxy, remove the filter and the network (after the container is gone)."""
        proxy = self._proxies.pop(session_id, None)
        self._tenants.pop(session_id, None)
        if proxy is not None:
            await proxy.close()
        if not keep_audit:
            self._audit.pop(session_id, None)
        await self._remove(session_id)

    async def _remove(self, session_id: str) -> None:
        if self.filter_mode is FilterMode.IPTABLES:
            await firewall.remove(bridge_name(self._owner_id, session_id))
        try:
            await self._engine.remove_network(network_name(self._owner_id, session_id))
        except SandboxError as exc:
            log.warning("egress: could not remove the network of %s: %s", session_id, exc)

    async def reconcile(
        self,
        load: Callable[[str], Awaitable[Session | None]],
        locked: Callable[[str], AbstractAsyncContextManager[None]],
        session_ids: Sequence[str],
    ) -> None:
        """Proxies back for live ALLOWLIST sessions; networks no session claims removed.

        Runs beside live calls: each decision is taken under the session's lock on a fresh
        read, so a delete or create in progress is never undone.
        """
        networks = await self._engine.list_networks(self._owner_id)
        labelled = {n.session_id for n in networks}
        for sid in sorted((labelled | set(session_ids)) - {""}):
            async with locked(sid):
                session = await load(sid)
                wanted = (
                    session is not None
                    and session.spec.network.mode is NetworkMode.ALLOWLIST
                    and session.state in (SessionState.RUNNING, SessionState.CREATING)
                )
                if session is None or not wanted:
                    if sid in labelled or sid in self._proxies:
                        log.info("egress: removing what session %s no longer claims", sid)
                        await self.release(sid, keep_audit=session is not None)
                    continue
                if session.state is SessionState.RUNNING and sid not in self._proxies:
                    try:
                        await self.prepare(session)
                        await self.install_trust(session)  # a new CA since the restart
                    except SandboxError as exc:
                        log.warning("egress: cannot restore the proxy of %s: %s", sid, exc)
