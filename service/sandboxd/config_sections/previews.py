"""The `[previews]` section of the server's configuration (declared here, gathered by
`sandboxd.config.Config` like every section)."""

from __future__ import annotations

from dataclasses import dataclass

from sandboxd.settings import DURATION, INT, SIZE, TEXT, host_port_problem, setting


def _listen_problem(value: str) -> str | None:
    return host_port_problem(value, "127.0.0.1:8443") if value else None


def _domain_problem(value: str) -> str | None:
    labels = value.lower().split(".")
    ok = all(
        0 < len(label) <= 63 and all(c.isascii() and (c.isalnum() or c == "-") for c in label)
        for label in labels
    )
    return None if not value or ok else "a DNS name, e.g. preview.example.com"


@dataclass(frozen=True)
class PreviewsSection:
    """Preview URLs of sessions' ports: the HTTP(S) listener and what one session may use."""

    listen: str = setting(
        "",
        TEXT,
        "preview listener host:port, TLS with tls_cert/tls_key when set (empty: off)",
        check=_listen_problem,
        flat="preview_listen",
    )
    domain: str = setting(
        "",
        TEXT,
        "wildcard domain of host-routed previews, <port>-<session>.<domain> (empty: path only)",
        check=_domain_problem,
        flat="preview_domain",
    )
    timeout_s: float = setting(
        30.0,
        DURATION,
        "how long a sandbox may take to begin its answer (then 504)",
        lo=0,
        lo_open=True,
        flat="preview_timeout",
    )
    idle_timeout_s: float = setting(
        60.0,
        DURATION,
        "how long a preview client may keep a connection without sending a request",
        lo=0,
        lo_open=True,
        flat="preview_idle_timeout",
    )
    head_timeout_s: float = setting(
        10.0,
        DURATION,
        "how long a client may take to send a whole request head (of a new connection: from "
        "its accept, TLS handshake included; of a kept-alive one: from its first byte)",
        lo=0,
        lo_open=True,
        flat="preview_head_timeout",
    )
    max_ttl_s: float = setting(
        7 * 86400.0,
        DURATION,
        "longest token lifetime PublishPort gives",
        lo=1,
        flat="preview_max_ttl",
    )
    max_clients: int = setting(
        1024,
        INT,
        "open client connections of the whole listener (beyond: 503 at once); admitted ones "
        "hold at most this less preview_max_pending, and when they are full a new tenant's "
        "connection takes the place of one of the tenant holding the most",
        lo=1,
        flat="preview_max_clients",
    )
    max_pending: int = setting(
        128,
        INT,
        "client connections of the whole listener that have not yet opened a preview (when "
        "full, the oldest of them is closed for a new one)",
        lo=1,
        flat="preview_max_pending",
    )
    max_pending_per_source: int = setting(
        16,
        INT,
        "of those, from one source address (an IPv6 /64; beyond: 503 at once; 0: no cap)",
        lo=0,
        flat="preview_max_pending_per_source",
    )
    max_tenant_clients: int = setting(
        256,
        INT,
        "open client connections to one tenant's previews (beyond: 429; 0: no cap)",
        lo=0,
        flat="preview_max_tenant_clients",
    )
    max_ports: int = setting(16, INT, "published ports per session", lo=1, flat="preview_max_ports")
    max_connections: int = setting(
        64,
        INT,
        "open preview connections per session (0: no cap)",
        lo=0,
        flat="preview_max_connections",
    )
    max_bytes: int = setting(
        0,
        SIZE,
        "bytes one session's previews may relay, both ways (0: no cap)",
        lo=0,
        flat="preview_max_bytes",
    )
