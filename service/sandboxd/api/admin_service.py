"""AdminService: what this server enforces, for operators and clients."""

from __future__ import annotations

from sandboxd import __version__
from sandboxd.api import convert, egress_convert
from sandboxd.api.errors import Ctx, unary
from sandboxd.config import Config
from sandboxd.egress.networks import EgressManager, FilterMode
from sandboxd.egress.policy import DEFAULT_QUOTAS, MAX_QUOTAS
from sandboxd.engine import Engine
from sandboxd.sweeper import Sweeper
from sandboxd.v1 import admin_pb2, admin_pb2_grpc, common_pb2

_EGRESS_FILTER = {
    FilterMode.IPTABLES: admin_pb2.EGRESS_FILTER_IPTABLES,
    FilterMode.UNFILTERED: admin_pb2.EGRESS_FILTER_UNFILTERED,
    FilterMode.UNAVAILABLE: admin_pb2.EGRESS_FILTER_UNAVAILABLE,
}

# The major version of the API this server speaks: clients refuse a server of another one.
API_VERSION = "v1"
# What every server of this version offers; optional extras are added per configuration.
_BASE_FEATURES = ("pty", "background_processes", "snapshots", "image_snapshots", "archives")


class AdminService(admin_pb2_grpc.AdminServiceServicer):
    def __init__(
        self,
        config: Config,
        engine: Engine,
        egress: EgressManager | None = None,
        sweeper: Sweeper | None = None,
    ) -> None:
        self._config = config
        self._engine = engine
        self._egress = egress
        self._sweeper = sweeper

    @unary
    async def Sweep(self, request: admin_pb2.SweepRequest, context: Ctx) -> admin_pb2.SweepResponse:
        if self._sweeper is None:  # pragma: no cover - server.py always passes one
            return admin_pb2.SweepResponse()
        r = await self._sweeper.sweep()
        return admin_pb2.SweepResponse(
            expired_sessions=r.expired_sessions,
            removed_containers=r.removed_containers,
            removed_networks=r.removed_networks,
            removed_images=r.removed_images,
        )

    @unary
    async def GetServerInfo(
        self, request: admin_pb2.GetServerInfoRequest, context: Ctx
    ) -> admin_pb2.GetServerInfoResponse:
        api_version = await self._engine.ping()
        c = self._config
        return admin_pb2.GetServerInfoResponse(
            version=__version__,
            docker_api_version=api_version,
            security_defaults=admin_pb2.SecurityDefaults(
                user="65534:65534",
                read_only_root_filesystem=True,
                capabilities_dropped=["ALL"],
                no_new_privileges=True,
                seccomp_profile="default",
                init=True,
                network_mode=common_pb2.NETWORK_MODE_DENY,
                limits=convert.limits_pb(c.limits.default),
                commands_denied_by_default=True,
                lease_seconds=int(c.leases.default_s),
                image=c.engine.image,
                lease=convert.duration_pb(c.leases.default_s),
            ),
            limits_max=convert.limits_pb(c.limits.max),
            assurance=common_pb2.ASSURANCE_ENFORCED,
            lease_max_seconds=int(c.leases.max_s),
            lease_max=convert.duration_pb(c.leases.max_s),
            egress_filter=_EGRESS_FILTER[
                self._egress.filter_mode if self._egress else FilterMode.UNAVAILABLE
            ],
            proxy_quotas_default=egress_convert.quotas_pb(DEFAULT_QUOTAS),
            proxy_quotas_max=egress_convert.quotas_pb(MAX_QUOTAS),
            api_version=API_VERSION,
            features=self._features(),
            isolation_tiers=[common_pb2.ISOLATION_RUNC],
        )

    def _features(self) -> list[str]:
        """Optional features this configuration has, so a client can check before relying."""
        features = list(_BASE_FEATURES)
        if self._egress is not None and self._egress.filter_mode is not FilterMode.UNAVAILABLE:
            features.append("egress")
        if self._config.metrics.listen:
            features.append("metrics")
        return features
