"""The sections of the server's configuration, each setting declared once: type (a `Kind`),
default, bounds or choices, help, and the external name flags, environment and TOML use.

`sandboxd.config.Config` gathers these sections; `sandboxd.settings` derives parsing, `--help`
and bound checks from the declarations, so adding a setting is one `setting(...)` line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandboxd.errors import ConfigError
from sandboxd.models import LIMIT_NAMES, Limits
from sandboxd.settings import (
    BOOL,
    DURATION,
    INT,
    OPTIONAL_PATH,
    PATH,
    SIZE,
    TEXT,
    host_port_problem,
    setting,
)

KiB, MiB, GiB = 1024, 1024**2, 1024**3


def _keeper_problem(value: str) -> str | None:
    uid, sep, gid = value.partition(":")
    if not sep or not uid.isdigit() or not gid.isdigit() or not uid.isascii() or not gid.isascii():
        return "a numeric non-root uid:gid"
    if int(uid) == 0 or int(gid) == 0:  # any spelling of root ("00:00", "0:5", "5:000")
        return "a numeric non-root uid:gid (uid 0 and gid 0 are root)"
    return None


def _owner_problem(value: str) -> str | None:
    ok = len(value) <= 64 and all(c.isascii() and (c.isalnum() or c in "_.-") for c in value)
    return None if ok else "letters, digits, '_', '.', '-' only"


def _metrics_listen_problem(value: str) -> str | None:
    return host_port_problem(value, "127.0.0.1:9464") if value else None


@dataclass(frozen=True)
class ServerSection:
    """The gRPC port, server state and the shape of shutdown."""

    listen: str = setting("127.0.0.1:50051", TEXT, "address to serve gRPC on, host:port")
    data_dir: Path = setting(Path("./data"), PATH, "session database and server state")
    owner_id: str = setting(
        "", TEXT, "label value marking this server's containers", check=_owner_problem
    )
    shutdown_grace_s: float = setting(5.0, DURATION, "grace for in-flight RPCs on SIGTERM", lo=0)
    shutdown_snapshot_s: float = setting(
        10.0, DURATION, "time SIGTERM gives to snapshotting running sessions (0: none)", lo=0
    )
    keepalive_interval_s: float = setting(
        15.0, DURATION, "keepalive period of quiet process streams", lo=0, lo_open=True
    )
    log_level: str = setting(
        "INFO", TEXT, "DEBUG, INFO, WARNING or ERROR", choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )
    log_format: str = setting(
        "json", TEXT, "json (one object per line) or text", choices=("json", "text")
    )


@dataclass(frozen=True)
class EngineSection:
    """The container engine, the runtime image and what runs in each container."""

    docker_host: str = setting(
        "", TEXT, "Docker engine address, unix:// or tcp:// (else DOCKER_HOST)"
    )
    docker_tls_ca: Path | None = setting(
        None, OPTIONAL_PATH, "PEM CA bundle the tcp:// engine's certificate must chain to"
    )
    docker_tls_cert: Path | None = setting(
        None, OPTIONAL_PATH, "PEM client certificate presented to the tcp:// engine"
    )
    docker_tls_key: Path | None = setting(None, OPTIONAL_PATH, "PEM private key of docker_tls_cert")
    docker_tls_verify: bool = setting(
        True, BOOL, "check the tcp:// engine's certificate and name (false: encrypted only)"
    )
    docker_allow_plain_tcp: bool = setting(
        False, BOOL, "allow a tcp:// engine without TLS (whoever reaches it owns its host)"
    )
    docker_pool_size: int = setting(
        1024, INT, "connections to the engine (one per open stream)", lo=10
    )
    image: str = setting("sandboxd-runtime:busybox", TEXT, "default runtime image of a session")
    helper: Path = setting(Path(), PATH, "path of the static sbx helper binary mounted in")
    keeper_user: str = setting(
        "65533:65533", TEXT, "uid:gid of each container's idle main process", check=_keeper_problem
    )
    pool_size: int = setting(
        0, INT, "warm containers kept for default sessions (0: off)", lo=0, hi=256
    )
    engine_check_interval_s: float = setting(
        2.0, DURATION, "how often the engine is pinged", lo=0, lo_open=True
    )


@dataclass(frozen=True)
class LimitsSection:
    """Resource limits of a session: what it gets when it asks for none, and the most it may ask."""

    default_memory_bytes: int = setting(256 * MiB, SIZE, "default memory_bytes", lo=6 * MiB)
    default_cpu_millis: int = setting(500, INT, "default cpu_millis", lo=10)
    default_pids: int = setting(64, INT, "default pids", lo=1)
    default_workspace_bytes: int = setting(64 * MiB, SIZE, "default workspace_bytes", lo=1)
    default_file_bytes: int = setting(1 * MiB, SIZE, "default file_bytes", lo=1)
    default_output_bytes: int = setting(1 * MiB, SIZE, "default output_bytes", lo=1)
    default_command_timeout_s: float = setting(
        10.0, DURATION, "default command_timeout_s", lo=0, lo_open=True
    )
    max_memory_bytes: int = setting(2 * GiB, SIZE, "largest memory_bytes", lo=1)
    max_cpu_millis: int = setting(2000, INT, "largest cpu_millis", lo=1)
    max_pids: int = setting(512, INT, "largest pids", lo=1)
    max_workspace_bytes: int = setting(1 * GiB, SIZE, "largest workspace_bytes", lo=1)
    max_file_bytes: int = setting(16 * MiB, SIZE, "largest file_bytes", lo=1)
    max_output_bytes: int = setting(16 * MiB, SIZE, "largest output_bytes", lo=1)
    max_command_timeout_s: float = setting(
        3600.0, DURATION, "largest command_timeout_s", lo=0, lo_open=True
    )

    @property
    def default(self) -> Limits:
        return Limits(**{n: getattr(self, f"default_{n}") for n in LIMIT_NAMES})

    @property
    def max(self) -> Limits:
        return Limits(**{n: getattr(self, f"max_{n}") for n in LIMIT_NAMES})


@dataclass(frozen=True)
class LeasesSection:
    """How long sessions live and how often expired ones are reaped."""

    default_s: float = setting(
        900.0, DURATION, "lease of a session that asks for none", flat="lease_default_s"
    )
    max_s: float = setting(
        86400.0, DURATION, "longest lease a session may have", flat="lease_max_s"
    )
    reaper_interval_s: float = setting(
        5.0, DURATION, "how often expired leases are reaped", lo=0, lo_open=True
    )


@dataclass(frozen=True)
class TenancySection:
    """Authentication, TLS, admin rights and what one tenant may hold at once."""

    tokens_file: Path | None = setting(
        None, OPTIONAL_PATH, "bearer tokens: 'tenant sha256hex [key=value...]' per line"
    )
    tls_cert: Path | None = setting(None, OPTIONAL_PATH, "PEM certificate chain of the gRPC port")
    tls_key: Path | None = setting(None, OPTIONAL_PATH, "PEM private key of tls_cert")
    tls_client_ca: Path | None = setting(
        None, OPTIONAL_PATH, "PEM CA bundle; set: client certificates required"
    )
    max_sessions: int = setting(
        0, INT, "live sessions per tenant (0: unlimited)", lo=0, flat="tenant_max_sessions"
    )
    max_memory_bytes: int = setting(
        0, SIZE, "memory of a tenant's sessions (0: no cap)", lo=0, flat="tenant_max_memory_bytes"
    )
    max_concurrent_execs: int = setting(
        0, INT, "running commands per tenant (0: no cap)", lo=0, flat="tenant_max_concurrent_execs"
    )
    max_streams: int = setting(
        256, INT, "open streaming RPCs per tenant (0: no cap)", lo=0, flat="tenant_max_streams"
    )
    stream_idle_timeout_s: float = setting(
        60.0,
        DURATION,
        "longest wait for a client's next upload message, or for a client to take a reply",
        lo=0,
        lo_open=True,
    )
    allow_insecure_public_listen: bool = setting(
        False, BOOL, "serve a non-loopback address without a tokens file (unsafe)"
    )


@dataclass(frozen=True)
class EgressSection:
    """The per-session egress proxy of ALLOWLIST sessions."""

    proxy_port: int = setting(
        3128,
        INT,
        "port the agent listens on for egress, on each ALLOWLIST sandbox's loopback",
        lo=1,
        hi=65535,
    )
    proxy_hosts: str = setting("", TEXT, "static egress name map name=address,... (before DNS)")
    private_networks: str = setting(
        "deny",
        TEXT,
        "deny: no session reaches private/loopback/link-local addresses; allow: a session may "
        "ask (tenants may be granted it in the tokens file)",
        choices=("deny", "allow"),
        flat="egress_private_networks",
    )
    resolver_threads: int = setting(
        4,
        INT,
        "threads of the proxy's own name resolver",
        lo=1,
        hi=64,
        flat="egress_resolver_threads",
    )
    dns_timeout_s: float = setting(
        5.0,
        DURATION,
        "longest name lookup of the proxy",
        lo=0,
        lo_open=True,
        hi=60,
        flat="egress_dns_timeout_s",
    )
    upstream_ca_file: str = setting(
        "",
        TEXT,
        "PEM bundle trusted besides the system roots when the proxy verifies an upstream it "
        "injects a secret for (private upstreams, tests)",
        flat="egress_upstream_ca_file",
    )
    secrets_file: str = setting(
        "",
        TEXT,
        "operator secrets for secret_ref: lines `tenant/name value` (re-read when changed)",
        flat="secrets_file",
    )
    secrets_key_file: str = setting(
        "",
        TEXT,
        "32-byte key (raw or hex), outside the data dir, sealing inline secret values in the "
        "store; empty: a key in memory only (inline values of live sessions lost on restart)",
        flat="secrets_key_file",
    )


@dataclass(frozen=True)
class ImagesSection:
    """Which images sessions may run."""

    allowlist: str = setting(
        "sandboxd-runtime:*",
        TEXT,
        "comma-separated image patterns sessions may use ('*' any run of characters); the "
        "default image and a tenant's own snapshot images are always allowed",
        flat="image_allowlist",
    )
    registry_auth_file: Path | None = setting(
        None,
        OPTIONAL_PATH,
        "registry credentials for pulls, in the format of Docker's config.json `auths` "
        "(read by the server only; never taken from callers, never logged)",
        flat="registry_auth_file",
    )
    max_image_bytes: int = setting(
        8 * GiB,
        SIZE,
        "largest image a pull may fetch (the manifest's layer sizes, then the pull's progress)",
        lo=1,
        flat="max_image_bytes",
    )
    pull_timeout_s: float = setting(
        600.0,
        DURATION,
        "longest one pull may take (a create also ends it at its own deadline)",
        lo=1,
        flat="pull_timeout_s",
    )
    unused_after_s: float = setting(
        7 * 24 * 3600.0,
        DURATION,
        "a pulled image no session used for this long is removed by the sweep",
        lo=0,
        flat="image_unused_after_s",
    )


@dataclass(frozen=True)
class ArchiveSection:
    """Archive import and export."""

    max_members: int = setting(
        100_000, INT, "most members one imported tar may hold", lo=1, flat="archive_max_members"
    )


@dataclass(frozen=True)
class MetricsSection:
    """The Prometheus endpoint."""

    listen: str = setting(
        "",
        TEXT,
        "Prometheus /metrics address host:port (empty: off)",
        check=_metrics_listen_problem,
        flat="metrics_listen",
    )


def _tiers_problem(value: str) -> str | None:
    from sandboxd.isolation import parse_tiers  # isolation imports nothing from here

    try:
        parse_tiers(value)
    except ConfigError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class IsolationSection:
    """Isolation tiers (runc, gvisor): which a session gets by default and which it may ask."""

    default: str = setting(
        "runc",
        TEXT,
        "tier of a session that does not ask for one: runc or gvisor",
        check=_tiers_problem,
        flat="isolation_default",
    )
    allowed: str = setting(
        "runc,gvisor",
        TEXT,
        "comma-separated tiers sessions may ask for (those the engine lacks are refused)",
        check=_tiers_problem,
        flat="isolation_allowed",
    )
    gvisor_runtime: str = setting(
        "runsc",
        TEXT,
        "name of the engine runtime that gives the gvisor tier (see `make gvisor`)",
        flat="isolation_gvisor_runtime",
    )


@dataclass(frozen=True)
class TemplatesSection:
    """Templates sessions may be created from by name."""

    python_image: str = setting(
        "sandboxd-runtime:python",
        TEXT,
        "image of the built-in `python` template (make python-image builds it)",
        flat="template_python_image",
    )
    max_context_bytes: int = setting(
        64 * 1024**2,
        SIZE,
        "largest build context BuildTemplate accepts (counted while it streams in)",
        lo=1,
        flat="template_max_context_bytes",
    )
    build_timeout_s: float = setting(
        300.0,
        DURATION,
        "longest a template build may run before it is stopped and cleaned up",
        lo=1,
        flat="template_build_timeout_s",
    )
    max_builds: int = setting(
        2, INT, "template builds one tenant may run at once", lo=1, flat="template_max_builds"
    )
    build_memory_bytes: int = setting(
        1024**3,
        SIZE,
        "memory limit of each template build step",
        lo=6 * 1024**2,
        flat="template_build_memory_bytes",
    )
    build_millicpus: int = setting(
        1000,
        INT,
        "CPU each template build step may use, in thousandths of a CPU",
        lo=10,
        flat="template_build_millicpus",
    )


@dataclass(frozen=True)
class AuditSection:
    """The durable audit log (service/sandboxd/audit): what is kept, how long, and its export."""

    enabled: bool = setting(True, BOOL, "record audit events in the store", flat="audit_enabled")
    max_age_s: float = setting(
        30 * 86400.0,
        DURATION,
        "audit events older than this are pruned",
        lo=1,
        flat="audit_max_age",
    )
    max_bytes: int = setting(
        256 * MiB,
        SIZE,
        "the audit events kept take at most this many bytes",
        lo=1,
        flat="audit_max_bytes",
    )
    batch_window_s: float = setting(
        0.0,
        DURATION,
        "audit commits wait this long to gather more events (0: none)",
        lo=0,
        hi=1.0,
        flat="audit_batch_window",
    )
    export_path: Path | None = setting(
        None,
        OPTIONAL_PATH,
        "append every audit event to this JSON Lines file (empty: none)",
        flat="audit_export_path",
    )


@dataclass(frozen=True)
class EventsSection:
    """Session events (WatchSession, WatchSessions)."""

    lease_warning_s: float = setting(
        60.0,
        DURATION,
        "LEASE_EXPIRING is sent this long before a lease ends",
        lo=0.1,
        flat="events_lease_warning",
    )
    window: int = setting(
        1000,
        INT,
        "events kept per tenant for a reconnecting watcher",
        lo=1,
        hi=100_000,
        flat="events_window",
    )


@dataclass(frozen=True)
class AgentSection:
    """The in-sandbox agent and its channel (docs/agent.md)."""

    enabled: bool = setting(
        True,
        BOOL,
        "run commands through each sandbox's agent (off: docker exec and an idle keeper)",
        flat="agent",
    )
    keepalive_s: float = setting(
        5.0, DURATION, "agent channel keepalive period", lo=0.1, hi=300, flat="agent_keepalive"
    )
    handshake_s: float = setting(
        10.0,
        DURATION,
        "how long an agent may take to answer a new channel epoch",
        lo=0.5,
        hi=300,
        flat="agent_handshake",
    )
    window: int = setting(
        1 * MiB,
        SIZE,
        "flow-control window of each agent stream, per direction",
        lo=4096,
        hi=16 * MiB,
        flat="agent_window",
    )
    detached_processes: bool = setting(
        True,
        BOOL,
        "background processes kept by the agent through a server crash and restart",
        flat="agent_detached_processes",
    )


@dataclass(frozen=True)
class WatchSection:
    """Directory watches (FilesystemService.WatchDir)."""

    max_per_session: int = setting(
        64, INT, "open WatchDir streams per session", lo=1, hi=10_000, flat="watch_max_per_session"
    )
    coalesce_s: float = setting(
        0.05,
        DURATION,
        "MODIFIED events of one file within this window are sent as one (0: each one)",
        lo=0,
        hi=10.0,
        flat="watch_coalesce",
    )
    queue: int = setting(
        1024,
        INT,
        "events a watch holds for a slow client before it drops them for an OVERFLOW event",
        lo=1,
        hi=1_000_000,
        flat="watch_queue",
    )
    max_directories: int = setting(
        8192,
        INT,
        "directories one recursive watch may watch (beyond: OVERFLOW)",
        lo=1,
        hi=1_000_000,
        flat="watch_max_directories",
    )
