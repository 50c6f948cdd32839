"""The `[e2b]` section of the server's configuration: the E2B-compatible door (declared here,
gathered by `sandboxd.config.Config` like every section). Off unless `e2b_listen` is set."""

from __future__ import annotations

from dataclasses import dataclass

from sandboxd.settings import INT, SIZE, TEXT, host_port_problem, setting


def _listen_problem(value: str) -> str | None:
    return host_port_problem(value, "127.0.0.1:3000") if value else None


def _domain_problem(value: str) -> str | None:
    labels = value.lower().split(".")
    ok = all(
        0 < len(label) <= 63 and all(c.isascii() and (c.isalnum() or c == "-") for c in label)
        for label in labels
    )
    return None if not value or ok else "a DNS name, e.g. sandboxes.example.com"


@dataclass(frozen=True)
class E2bSection:
    """The E2B-compatible REST and envd (Connect) listener over the same sessions."""

    listen: str = setting(
        "",
        TEXT,
        "E2B-compatible REST and envd listener host:port, HTTP/1.1 and cleartext HTTP/2 "
        "(empty: off); point E2B_API_URL and E2B_SANDBOX_URL at it",
        check=_listen_problem,
        flat="e2b_listen",
    )
    domain: str = setting(
        "",
        TEXT,
        "the `domain` reported to E2B clients; envd is also routed by the host "
        "49983-<sandbox>.<domain> (empty: the E2b-Sandbox-Id header only)",
        check=_domain_problem,
        flat="e2b_domain",
    )
    max_request_bytes: int = setting(
        64 * 1024**2,
        SIZE,
        "largest request body the E2B door reads (an upload above it is refused with 413)",
        lo=1024,
        flat="e2b_max_request_bytes",
    )
    max_clients: int = setting(
        4096,
        INT,
        "open connections the E2B door holds in all; past it a new one is closed at accept, "
        "before a byte is read (0: no cap)",
        lo=0,
        hi=1 << 20,
        flat="e2b_max_clients",
    )
    max_clients_per_source: int = setting(
        1024,
        INT,
        "open connections to the E2B door from one address (an IPv6 /64); past it that "
        "address's new one is closed at accept (0: no cap). The SDK keeps one per sandbox",
        lo=0,
        hi=1 << 20,
        flat="e2b_max_clients_per_source",
    )
