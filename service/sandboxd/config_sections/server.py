"""Sections of the server process itself: its gRPC port and state, the container engine,
the metrics endpoint and the isolation tiers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandboxd.errors import ConfigError
from sandboxd.isolation import parse_tiers
from sandboxd.settings import (
    BOOL,
    DURATION,
    INT,
    OPTIONAL_PATH,
    PATH,
    TEXT,
    host_port_problem,
    setting,
)

# The first id of the default block: systemd's "unused" span above 1879048191 (its container
# ranges end there) and below its foreign ranges (2147352576): docs/uids-gids of systemd.
HOST_UID_FIRST = 1_900_000_000
MAX_ID = 2**31 - 1  # validation's bound on a uid or gid


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


METRICS_OFF = ("", "off")


def _metrics_listen_problem(value: str) -> str | None:
    return None if value in METRICS_OFF else host_port_problem(value, "127.0.0.1:9464")


def _otlp_endpoint_problem(value: str) -> str | None:
    if not value:
        return None
    address = value.split("://", 1)[1] if "://" in value else value
    if "://" in value and value.split("://", 1)[0] not in ("http", "https"):
        return "use host:port, http://host:port (plaintext) or https://host:port"
    return host_port_problem(address.rstrip("/"), "127.0.0.1:4317", ip_only=False)


@dataclass(frozen=True)
class ServerSection:
    """The gRPC port, server state and the shape of shutdown."""

    listen: str = setting("127.0.0.1:50051", TEXT, "address to serve gRPC on, host:port")
    max_connections: int = setting(
        1024,
        INT,
        "open connections of the gRPC port, authenticated or not (beyond: closed at once, so a "
        "flood of them cannot take the file descriptors the sessions need; 0: no cap)",
        lo=0,
    )
    data_dir: Path = setting(Path("./data"), PATH, "session database and server state")
    owner_id: str = setting(
        "", TEXT, "label value marking this server's containers", check=_owner_problem
    )
    shutdown_grace_s: float = setting(5.0, DURATION, "grace for in-flight RPCs on SIGTERM", lo=0)
    shutdown_snapshot_s: float = setting(
        10.0, DURATION, "time SIGTERM gives to snapshotting running sessions (0: none)", lo=0
    )
    checkpoint_interval_s: float = setting(
        0.0,
        DURATION,
        "how often every running session's workspace is snapshotted, so a dead sandbox is "
        "rebuilt from a state at most this old (0: never)",
        lo=0,
    )
    keepalive_interval_s: float = setting(
        15.0, DURATION, "keepalive period of quiet process streams", lo=0, lo_open=True
    )
    interact_idle_timeout_s: float = setting(
        1800.0,
        DURATION,
        "Interact ends a command with no input and no output for this long (a call may ask "
        "for another, up to lease_max_s)",
        lo=0,
        lo_open=True,
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
    disk_tool_image: str = setting(
        "sandboxd-disktool:1",
        TEXT,
        "image of the short-lived tool container that makes disk workspaces (e2fsprogs, "
        "losetup; `make disk-image` builds it on the engine)",
    )
    keeper_user: str = setting(
        "65533:65533", TEXT, "uid:gid of each container's idle main process", check=_keeper_problem
    )
    pool_size: int = setting(
        0, INT, "warm containers kept for default sessions (0: off)", lo=0, hi=256
    )
    # Each session's own host uid and gid (the same number), so that no kernel count kept per
    # uid (inotify instances, pipe pages, message queues, RLIMIT_NPROC...) is shared between
    # sessions. The default block lies in the ids systemd leaves unused (above its container
    # ranges, below 2^31): no normal or system user, no nspawn or rootless-podman range.
    host_uid_first: int = setting(
        HOST_UID_FIRST, INT, "first host uid (and gid) allocated to sessions", lo=1000, hi=MAX_ID
    )
    host_uid_count: int = setting(
        65536, INT, "how many host uids sessions are allocated from", lo=1, hi=1 << 24
    )
    engine_check_interval_s: float = setting(
        2.0, DURATION, "how often the engine is pinged", lo=0, lo_open=True
    )


@dataclass(frozen=True)
class MetricsSection:
    """What an operator watches: the Prometheus endpoint, traces and the access log."""

    listen: str = setting(
        "127.0.0.1:9464",
        TEXT,
        "Prometheus /metrics address host:port (off: none); loopback unless set otherwise",
        check=_metrics_listen_problem,
        flat="metrics_listen",
    )
    otlp_endpoint: str = setting(
        "",
        TEXT,
        "OpenTelemetry collector for traces over OTLP/gRPC: host:port or https://host:port "
        "(TLS), http://host:port (plaintext); empty: spans are not exported",
        check=_otlp_endpoint_problem,
    )
    access_log: bool = setting(
        True, BOOL, "one INFO line per RPC: method, tenant, session, code, duration"
    )
    session_limit: int = setting(
        100,
        INT,
        "running sessions given series of their own (CPU, memory, workspace, egress), the oldest "
        "first; the rest are counted in sandboxd_session_series_omitted (0: no per-session series)",
        lo=0,
        hi=10_000,
        flat="metrics_session_limit",
    )
    session_interval_s: float = setting(
        30.0,
        DURATION,
        "how often the per-session series are read (an engine stats call and a df per session)",
        lo=1,
        flat="metrics_session_interval_s",
    )

    @property
    def served(self) -> bool:
        """Whether /metrics is served at all (`metrics_listen = "off"` turns it off)."""
        return self.listen not in METRICS_OFF


def _tiers_problem(value: str) -> str | None:
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
