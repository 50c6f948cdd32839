"""Prometheus metrics, served on their own HTTP port so scraping never competes with gRPC.

One `Metrics` object per server owns its registry (no module globals: two servers in one
process, as in tests, do not share counters). Components that produce a number get the object
(or one of its methods) from `server.serve`: the RPC interceptor (latency, exec and archive
bytes), the engine adapter (errors), the pool, and the egress audit log (proxy verdicts).
Session counts by state are read from the store at scrape time.

Exposed (all prefixed `sandboxd_`):
  sessions{state}                      gauge, from the store on every scrape
  rpc_duration_seconds{method,code}    histogram of every RPC (unary: until the reply;
                                       streams: until the last message)
  exec_output_bytes_total{stream}      stdout/stderr bytes sent to callers by Exec and Run
  archive_bytes_total{direction}       workspace export/import bytes
  proxy_decisions_total{decision}      egress proxy allow/deny decisions
  engine_errors_total{kind}            Docker failures: unavailable, not_found, conflict, internal
  pool_available                       warm containers ready to claim
  pool_claims_total{result}            CreateSession served warm (hit) or cold (miss)
  tenant_events_total{tenant,kind}     audited actions per tenant (command, file_write, egress,
                                       lifecycle, refused, ...: the audit log's kinds), from
                                       the domain's events (`observe`), audit on or off
  tenant_command_seconds{tenant}       histogram of command durations per tenant
  tenant_output_bytes_total{tenant}    output bytes commands wrote per tenant (before a reply's
                                       cut)
  tenant_egress_total{tenant,verdict}  egress decisions per tenant (allowed, refused)
  build_info{version,python,grpc}      1, with what this server is
  engine_up                            1 while the engine answers its health check, else 0
  rpc_in_flight{method}                calls being served (streams until their last message)
  lease_expiries_total{action}         leases that ran out: delete, suspend, snapshot
  swept_total{kind}                    what sweeps removed: containers, images, networks,
                                       and sessions whose ended lease they expired
Per-tenant series never carry a session label; tenants are the tokens file's (bounded by the
operator), and past `MAX_TENANTS` distinct ones the rest count as tenant "other".
plus the standard process_* (RSS, CPU, open fds) and python_* collectors.
"""

from __future__ import annotations

import asyncio
import logging
import platform
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import grpc
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from sandboxd import __version__, domain_events
from sandboxd.audit.subscriber import kind_of as audit_kind_of
from sandboxd.models import SessionState
from sandboxd.session_metrics import SessionGauges

log = logging.getLogger(__name__)

MAX_TENANTS = 1000  # distinct tenant label values; beyond, "other" (bounded cardinality)

# RPCs range from a ~1 ms Stat to a create that waits for Docker, to Exec streams of minutes.
_RPC_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


class Metrics:
    """Every sandboxd metric, on a registry of its own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.sessions = Gauge("sandboxd_sessions", "Sessions by state", ["state"], registry=r)
        self.rpc_duration = Histogram(
            "sandboxd_rpc_duration_seconds",
            "RPC latency by method and status code",
            ["method", "code"],
            buckets=_RPC_BUCKETS,
            registry=r,
        )
        self.exec_output_bytes = Counter(
            "sandboxd_exec_output_bytes",
            "Command output bytes sent to callers",
            ["stream"],
            registry=r,
        )
        self.archive_bytes = Counter(
            "sandboxd_archive_bytes",
            "Workspace archive bytes by direction (export, import)",
            ["direction"],
            registry=r,
        )
        self.proxy_decisions = Counter(
            "sandboxd_proxy_decisions",
            "Egress proxy decisions (allow, deny)",
            ["decision"],
            registry=r,
        )
        self.engine_errors = Counter(
            "sandboxd_engine_errors", "Docker engine failures by kind", ["kind"], registry=r
        )
        self.pool_available = Gauge(
            "sandboxd_pool_available", "Warm containers ready to claim", registry=r
        )
        self.pool_claims = Counter(
            "sandboxd_pool_claims",
            "Session creates by pool result (hit, miss)",
            ["result"],
            registry=r,
        )
        self.tenant_events = Counter(
            "sandboxd_tenant_events",
            "Audited actions per tenant and kind",
            ["tenant", "kind"],
            registry=r,
        )
        self.tenant_command_seconds = Histogram(
            "sandboxd_tenant_command_seconds",
            "Command durations per tenant",
            ["tenant"],
            buckets=_RPC_BUCKETS,
            registry=r,
        )
        self.tenant_output_bytes = Counter(
            "sandboxd_tenant_output_bytes",
            "Command output bytes per tenant",
            ["tenant"],
            registry=r,
        )
        self.tenant_egress = Counter(
            "sandboxd_tenant_egress",
            "Egress decisions per tenant",
            ["tenant", "verdict"],
            registry=r,
        )
        self._tenants: set[str] = set()
        self._event_children: dict[tuple[str, str], Any] = {}
        self._command_children_of: dict[str, tuple[Any, Any]] = {}
        self.secret_events = Counter(
            "sandboxd_secret_events",
            "Secrets injected by the egress proxy, and placeholders sent elsewhere, by tenant",
            ["tenant", "kind"],
            registry=r,
        )
        self.build_info = Gauge(
            "sandboxd_build_info",
            "This server: version, Python and grpcio (always 1)",
            ["version", "python", "grpc"],
            registry=r,
        )
        self.build_info.labels(
            __version__, platform.python_version(), getattr(grpc, "__version__", "")
        ).set(1)
        self.engine_up = Gauge(
            "sandboxd_engine_up", "1 while the engine answers its health check", registry=r
        )
        self.rpc_in_flight = Gauge(
            "sandboxd_rpc_in_flight",
            "Calls being served by method (streams until their last message)",
            ["method"],
            registry=r,
        )
        self.lease_expiries = Counter(
            "sandboxd_lease_expiries",
            "Leases that ran out, by what was done (delete, suspend, snapshot)",
            ["action"],
            registry=r,
        )
        self.swept = Counter(
            "sandboxd_swept",
            "What sweeps removed, by kind (containers, images, networks, expired sessions)",
            ["kind"],
            registry=r,
        )
        self.audit_unrecorded = Counter(
            "sandboxd_audit_unrecorded",
            "Audit events a failed write (a full disk) did not record, by fate (answered: the"
            " waiting call got the failure; dropped: no call waited, an egress decision)",
            ["fate"],
            registry=r,
        )
        self.session_gauges = SessionGauges(r)  # set by session_metrics.SessionSampler
        for action in ("delete", "suspend", "snapshot"):
            self.lease_expiries.labels(action)
        for kind in ("containers", "images", "networks", "sessions"):
            self.swept.labels(kind)
        for state in SessionState:
            self.sessions.labels(state.value).set(0)
        for kind in ("unavailable", "not_found", "conflict", "internal"):
            self.engine_errors.labels(kind)
        for decision in ("allow", "deny"):
            self.proxy_decisions.labels(decision)
        for direction in ("export", "import"):
            self.archive_bytes.labels(direction)

    def proxy_decision(self, allowed: bool) -> None:
        self.proxy_decisions.labels("allow" if allowed else "deny").inc()

    def _tenant(self, tenant: str) -> str:
        if tenant in self._tenants:
            return tenant
        if len(self._tenants) >= MAX_TENANTS:
            return "other"
        self._tenants.add(tenant)
        return tenant

    def observe(self, event: domain_events.DomainEvent) -> None:
        """The domain's events the metrics count (a subscriber of the server's observer): each
        one the audit log makes a record of, per tenant and kind, audit on or off; a command's
        duration and output at its exit; each egress decision's verdict; what sweeps removed."""
        if isinstance(event, domain_events.Swept):
            self.swept_away(
                containers=event.removed_containers,
                images=event.removed_images,
                networks=event.removed_networks,
                sessions=event.expired_sessions,
            )
        kind = audit_kind_of(event)
        if kind is None:
            return
        t = self._tenant(event.tenant)
        self._event_child(t, kind).inc()
        if isinstance(event, domain_events.CommandExited):
            seconds, output = self._command_children(t)
            seconds.observe(event.duration_s)
            output.inc(event.stdout_bytes + event.stderr_bytes)
        elif isinstance(event, domain_events.EgressDecided) and kind == "egress":
            self.tenant_egress.labels(t, "allowed" if event.allowed else "refused").inc()

    # Each series' child looked up once (labels() takes a lock and checks its values on every
    # call: three times per command). Bounded: at most MAX_TENANTS tenants and the audit kinds.

    def _event_child(self, tenant: str, kind: str) -> Any:
        child = self._event_children.get((tenant, kind))
        if child is None:
            child = self._event_children[tenant, kind] = self.tenant_events.labels(tenant, kind)
        return child

    def _command_children(self, tenant: str) -> tuple[Any, Any]:
        children = self._command_children_of.get(tenant)
        if children is None:
            children = self._command_children_of[tenant] = (
                self.tenant_command_seconds.labels(tenant),
                self.tenant_output_bytes.labels(tenant),
            )
        return children

    def secret_event(self, tenant: str, kind: str) -> None:
        """kind: secret_injected or secret_misdirected (no session label: bounded series)."""
        self.secret_events.labels(tenant, kind).inc()

    def engine_error(self, kind: str) -> None:
        self.engine_errors.labels(kind).inc()

    def engine_answers(self, up: bool) -> None:
        self.engine_up.set(1 if up else 0)

    def audit_unrecorded_events(self, answered: int, dropped: int) -> None:
        self.audit_unrecorded.labels("answered").inc(answered)
        self.audit_unrecorded.labels("dropped").inc(dropped)

    def lease_expired(self, action: str) -> None:
        """action: delete, suspend or snapshot (kept, then deleted)."""
        self.lease_expiries.labels(action).inc()

    def swept_away(
        self, *, containers: int = 0, images: int = 0, networks: int = 0, sessions: int = 0
    ) -> None:
        for kind, count in (
            ("containers", containers),
            ("images", images),
            ("networks", networks),
            ("sessions", sessions),
        ):
            if count:
                self.swept.labels(kind).inc(count)

    def set_session_counts(self, counts: dict[str, int]) -> None:
        for state in SessionState:
            self.sessions.labels(state.value).set(counts.get(state.value, 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """`GET /metrics` on `listen` (host:port; port 0 picks one, the log says which)."""

    def __init__(
        self,
        metrics: Metrics,
        listen: str,
        refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._metrics = metrics
        self._listen = listen
        self._refresh = refresh
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def __aenter__(self) -> MetricsServer:
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        host, _, port = self._listen.rpartition(":")
        site = web.TCPSite(self._runner, host.strip("[]"), int(port))
        await site.start()
        address = self._runner.addresses[0]
        self.port = int(address[1])
        log.info("metrics served at http://%s:%d/metrics", host, self.port)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        if self._refresh is not None:
            try:
                await self._refresh()
            except Exception as exc:  # a scrape must not fail because one source did
                log.warning("metrics refresh failed: %s", exc)
        # /proc reads by the process collector are small, but keep them off the loop anyway.
        body = await asyncio.to_thread(self._metrics.render)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
