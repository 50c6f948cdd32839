"""Sections of who may do what and what leaves: tenants and TLS, the egress allowlist, the
audit log."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandboxd.config_sections.units import GiB, MiB
from sandboxd.settings import (
    BOOL,
    DURATION,
    INT,
    OPTIONAL_PATH,
    SIZE,
    TEXT,
    setting,
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
    max_disk_bytes: int = setting(
        0,
        SIZE,
        "disk workspaces and volumes (at their size) and snapshots (at what they take) of a "
        "tenant together (0: no cap)",
        lo=0,
        flat="tenant_max_disk_bytes",
    )
    max_concurrent_execs: int = setting(
        0, INT, "running commands per tenant (0: no cap)", lo=0, flat="tenant_max_concurrent_execs"
    )
    max_image_bytes: int = setting(
        20 * GiB,
        SIZE,
        "bytes of a tenant's templates and image snapshots together, by whole image size "
        "(beyond: TENANT_IMAGE_QUOTA; 0: no cap)",
        lo=0,
        flat="tenant_max_image_bytes",
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
