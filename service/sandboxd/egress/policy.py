"""A session's network policy, validated and normalized; proxy quotas within server maxima.

Domains are stored normalized (lower case, IDNA, no trailing dot, `*.` kept) and sorted, so
two spellings of one allowlist give one fingerprint.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sandboxd import tenancy, validation
from sandboxd.errors import InvalidArgument, PermissionDenied
from sandboxd.models import NetworkMode, NetworkPolicy, ProxyQuotas
from sandboxd.reasons import Reason
from sandboxd.secrets import bindings
from sandboxd.targets import TargetError, normalize_pattern

MAX_DOMAINS = 256
MAX_PORTS = 64
GiB = 1024**3

DEFAULT_QUOTAS = ProxyQuotas(
    max_connections=32,
    max_dns_lookups=8,
    max_requests=10_000,
    max_bytes_up=1 * GiB,
    max_bytes_down=4 * GiB,
    idle_timeout_s=60.0,
    tunnel_lifetime_s=3600.0,
    header_timeout_s=10.0,
)
MAX_QUOTAS = ProxyQuotas(
    max_connections=256,
    max_dns_lookups=64,
    max_requests=1_000_000,
    max_bytes_up=64 * GiB,
    max_bytes_down=64 * GiB,
    idle_timeout_s=3600.0,
    tunnel_lifetime_s=86400.0,
    header_timeout_s=60.0,
)
QUOTA_NAMES = tuple(f.name for f in dataclasses.fields(ProxyQuotas))


@dataclass(frozen=True)
class ResolvedQuotas:
    """Quotas with every field set; what a proxy enforces."""

    max_connections: int
    max_dns_lookups: int
    max_requests: int
    max_bytes_up: int
    max_bytes_down: int
    idle_timeout_s: float
    tunnel_lifetime_s: float
    header_timeout_s: float

    @classmethod
    def of(cls, quotas: ProxyQuotas) -> ResolvedQuotas:
        values = dataclasses.asdict(quotas)
        missing = [k for k, v in values.items() if v is None]
        if missing:
            raise ValueError(f"quotas not resolved: {missing}")
        return cls(**values)


def resolve_quotas(asked: ProxyQuotas, defaults: ProxyQuotas, maxima: ProxyQuotas) -> ProxyQuotas:
    """Fill unset quotas from the defaults; refuse any that is not positive or above the maximum."""
    values = {}
    for name in QUOTA_NAMES:
        value = getattr(asked, name)
        if value is None:
            values[name] = getattr(defaults, name)
            continue
        maximum = getattr(maxima, name)
        if value <= 0:
            raise InvalidArgument(
                f"network.quotas.{name} must be positive",
                reason=Reason.NETWORK_POLICY_INVALID,
                metadata={"quota": name},
            )
        values[name] = validation.at_most(value, maximum, name=f"network.quotas.{name}")
    return ProxyQuotas(**values)


def validate_policy(
    asked: NetworkPolicy,
    *,
    default_quotas: ProxyQuotas = DEFAULT_QUOTAS,
    max_quotas: ProxyQuotas = MAX_QUOTAS,
    private_networks_granted: bool | None = None,
) -> NetworkPolicy:
    """The normalized policy a session keeps, or InvalidArgument NETWORK_POLICY_INVALID.

    `allow_private_networks` is the operator's to grant (setting `egress_private_networks`,
    or the tenant's tokens-file option): asked for without `private_networks_granted` it is
    PERMISSION_DENIED, reason PRIVATE_NETWORKS_NOT_GRANTED. None: the grant of the call being
    served (`tenancy.current_grants()`, set by the interceptors; none outside a call). The
    proxy enforces the grant on its own as well, and never reaches the host whatever it is.
    """
    if private_networks_granted is None:
        private_networks_granted = tenancy.current_grants().private_networks is True
    if asked.mode is not NetworkMode.ALLOWLIST:
        if (
            asked.allowed_domains
            or asked.allowed_ports
            or asked.allow_private_networks
            or asked.secrets
            or asked.refuse_misdirected_secrets
        ):
            raise InvalidArgument(
                "network.allowed_domains, allowed_ports, allow_private_networks and secrets "
                "need network.mode ALLOWLIST",
                reason=Reason.NETWORK_POLICY_INVALID,
            )
        if any(v is not None for v in dataclasses.asdict(asked.quotas).values()):
            raise InvalidArgument(
                "network.quotas need network.mode ALLOWLIST", reason=Reason.NETWORK_POLICY_INVALID
            )
        return NetworkPolicy(mode=NetworkMode.DENY)
    if len(asked.allowed_domains) > MAX_DOMAINS or len(asked.allowed_ports) > MAX_PORTS:
        raise InvalidArgument(
            f"network allows at most {MAX_DOMAINS} domains and {MAX_PORTS} ports",
            reason=Reason.NETWORK_POLICY_INVALID,
        )
    domains = set()
    for pattern in asked.allowed_domains:
        try:
            domains.add(normalize_pattern(pattern))
        except TargetError as exc:
            raise InvalidArgument(
                f"network.allowed_domains entry {pattern[:300]!r}: {exc}",
                reason=Reason.NETWORK_POLICY_INVALID,
                metadata={"domain": pattern[:300]},
            ) from None
    for port in asked.allowed_ports:
        if not 1 <= port <= 65535:
            raise InvalidArgument(
                f"network.allowed_ports entry {port} is not a port (1-65535)",
                reason=Reason.NETWORK_POLICY_INVALID,
            )
    if asked.allow_private_networks and not private_networks_granted:
        raise PermissionDenied(
            "network.allow_private_networks is not granted to this tenant: the operator grants "
            "it (setting egress_private_networks=allow, or egress_private_networks=allow in "
            "the tokens file)",
            reason=Reason.PRIVATE_NETWORKS_NOT_GRANTED,
        )
    if not domains or not asked.allowed_ports:
        raise InvalidArgument(
            "network.mode ALLOWLIST needs at least one allowed domain and one allowed port",
            reason=Reason.NETWORK_POLICY_INVALID,
        )
    allowed_domains = tuple(sorted(domains))
    return NetworkPolicy(
        mode=NetworkMode.ALLOWLIST,
        allowed_domains=allowed_domains,
        allowed_ports=tuple(sorted(set(asked.allowed_ports))),
        allow_private_networks=asked.allow_private_networks,
        quotas=resolve_quotas(asked.quotas, default_quotas, max_quotas),
        secrets=bindings.validate(asked.secrets, allowed_domains),
        refuse_misdirected_secrets=asked.refuse_misdirected_secrets,
    )
