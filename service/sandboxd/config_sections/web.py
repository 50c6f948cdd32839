"""The `[web]` section of the server's configuration (declared here, gathered by
`sandboxd.config.Config` like every section)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from sandboxd.settings import DURATION, INT, SIZE, TEXT, host_port_problem, setting

MiB = 1024 * 1024


def _listen_problem(value: str) -> str | None:
    return host_port_problem(value, "127.0.0.1:8080") if value else None


def origins(value: str) -> tuple[str, ...]:
    """The comma-separated origins of `web_allowed_origins`, each as a browser sends it."""
    return tuple(o.strip().rstrip("/").lower() for o in value.split(",") if o.strip())


def _origins_problem(value: str) -> str | None:
    for origin in origins(value):
        if origin == "*":
            continue
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
            return f"{origin!r}: an origin is scheme://host[:port], e.g. https://app.example.com"
    return None


@dataclass(frozen=True)
class WebSection:
    """The web gateway's listener and the bounds of what one web caller may send."""

    listen: str = setting(
        "",
        TEXT,
        "web gateway (Connect and gRPC-Web) host:port, TLS with tls_cert/tls_key when set "
        "(empty: off)",
        check=_listen_problem,
        flat="web_listen",
    )
    allowed_origins: str = setting(
        "",
        TEXT,
        "comma-separated browser origins the gateway answers (CORS), '*' for any; a request "
        "with another Origin is refused (empty: none, only callers that send no Origin)",
        check=_origins_problem,
        flat="web_allowed_origins",
    )
    max_request_bytes: int = setting(
        4 * MiB,
        SIZE,
        "largest request body (one message and its framing; beyond: refused before it is read)",
        lo=1024,
        flat="web_max_request_bytes",
    )
    idle_timeout_s: float = setting(
        60.0,
        DURATION,
        "how long a web client may keep a connection open without a request, and may take to "
        "send a request's body",
        lo=0,
        lo_open=True,
        flat="web_idle_timeout",
    )
    max_calls: int = setting(
        256,
        INT,
        "calls in flight through the gateway at once (beyond: resource_exhausted at once)",
        lo=1,
        flat="web_max_calls",
    )
    max_clients: int = setting(
        1024,
        INT,
        "open connections the web gateway holds in all; past it a new one is closed at "
        "accept, before a byte is read (0: no cap)",
        lo=0,
        hi=1 << 20,
        flat="web_max_clients",
    )
    max_clients_per_source: int = setting(
        256,
        INT,
        "open connections to the web gateway from one address (an IPv6 /64); past it that "
        "address's new one is closed at accept (0: no cap)",
        lo=0,
        hi=1 << 20,
        flat="web_max_clients_per_source",
    )
