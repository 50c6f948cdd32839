"""The server's description of itself (ServerInfo, with its security defaults) and an admin
sweep's counts (SweepResult), as `sandboxd_client.models` spells them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Self

from sandboxd_client._convert import enum_name
from sandboxd_client._lazy import lazy
from sandboxd_client.models_policies import ProxyQuotas, ResourceLimits

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import admin_pb2, common_pb2
else:  # loaded on first use (sandboxd_client._lazy)
    admin_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.admin_pb2")
    common_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.common_pb2")


@dataclasses.dataclass(frozen=True)
class SecurityDefaults:
    user: str
    read_only_root_filesystem: bool
    capabilities_dropped: tuple[str, ...]
    no_new_privileges: bool
    seccomp_profile: str
    init: bool
    network_mode: str
    limits: ResourceLimits
    commands_denied_by_default: bool
    lease_seconds: int
    image: str

    @classmethod
    def from_pb(cls, m: admin_pb2.SecurityDefaults) -> Self:
        return cls(
            m.user,
            m.read_only_root_filesystem,
            tuple(m.capabilities_dropped),
            m.no_new_privileges,
            m.seccomp_profile,
            m.init,
            enum_name(common_pb2.NetworkMode, m.network_mode, "NETWORK_MODE_"),
            ResourceLimits.from_pb(m.limits),
            m.commands_denied_by_default,
            m.lease_seconds,
            m.image,
        )


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    version: str
    api_version: str
    features: tuple[str, ...]
    isolation_tiers: tuple[str, ...]
    docker_api_version: str
    security_defaults: SecurityDefaults
    limits_max: ResourceLimits
    assurance: str
    lease_max_seconds: int
    egress_filter: str
    proxy_quotas_default: ProxyQuotas
    proxy_quotas_max: ProxyQuotas

    def has(self, feature: str) -> bool:
        return feature in self.features

    @classmethod
    def from_pb(cls, m: admin_pb2.GetServerInfoResponse) -> Self:
        return cls(
            m.version,
            m.api_version,
            tuple(m.features),
            tuple(enum_name(common_pb2.Isolation, t, "ISOLATION_") for t in m.isolation_tiers),
            m.docker_api_version,
            SecurityDefaults.from_pb(m.security_defaults),
            ResourceLimits.from_pb(m.limits_max),
            enum_name(common_pb2.Assurance, m.assurance, "ASSURANCE_"),
            m.lease_max_seconds,
            enum_name(admin_pb2.EgressFilter, m.egress_filter, "EGRESS_FILTER_"),
            ProxyQuotas.from_pb(m.proxy_quotas_default),
            ProxyQuotas.from_pb(m.proxy_quotas_max),
        )


@dataclasses.dataclass(frozen=True)
class SweepResult:
    expired_sessions: int
    removed_containers: int
    removed_networks: int
    removed_images: int

    @classmethod
    def from_pb(cls, m: admin_pb2.SweepResponse) -> Self:
        return cls(m.expired_sessions, m.removed_containers, m.removed_networks, m.removed_images)
