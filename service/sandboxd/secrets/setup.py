"""The server-wide side of secrets, handed to the egress manager: vault, upstream trust,
metrics; it builds each session's Interceptor."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from sandboxd.errors import ConfigError
from sandboxd.models import NetworkPolicy
from sandboxd.secrets.interceptor import Interceptor
from sandboxd.secrets.vault import Vault, vault


@dataclass
class SecretsSetup:
    vault: Vault = field(default_factory=vault)
    upstream_ca_file: str = ""
    # (tenant, kind) for each injection or misdirection; the metrics count them.
    on_event: Callable[[str, str], None] | None = None
    _upstream: ssl.SSLContext | None = None

    def __post_init__(self) -> None:
        self.upstream()  # a bad egress_upstream_ca_file stops the start, not a session

    def upstream(self) -> ssl.SSLContext:
        if self._upstream is None:
            try:
                self._upstream = upstream_context(self.upstream_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"egress_upstream_ca_file {self.upstream_ca_file!r}: {exc}"
                ) from None
        return self._upstream

    def interceptor(
        self, session_id: str, tenant: str, policy: NetworkPolicy
    ) -> Interceptor | None:
        """None for a session without secrets: its CONNECTs stay plain tunnels."""
        if not policy.secrets:
            return None
        return Interceptor(
            session_id,
            tenant,
            policy.secrets,
            policy.refuse_misdirected_secrets,
            self.vault,
            self.upstream(),
        )

    def counter(self, tenant: str) -> Callable[[str], None] | None:
        on_event = self.on_event
        if on_event is None:
            return None
        return lambda kind: on_event(tenant, kind)


def upstream_context(extra_ca_file: str) -> ssl.SSLContext:
    """Verifies real upstreams: the system roots, plus `egress_upstream_ca_file` if set."""
    ctx = ssl.create_default_context()
    if extra_ca_file:
        ctx.load_verify_locations(cafile=extra_ca_file)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx
