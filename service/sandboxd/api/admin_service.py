"""AdminService: what this server enforces, for operators and clients."""

from __future__ import annotations

from sandboxd import __version__
from sandboxd.api import convert
from sandboxd.api.errors import Ctx, unary
from sandboxd.config import Config
from sandboxd.engine import Engine
from sandboxd.v1 import admin_pb2, admin_pb2_grpc, common_pb2


class AdminService(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, config: Config, engine: Engine) -> None:
        self._config = config
        self._engine = engine

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
                limits=convert.limits_pb(c.default_limits),
                commands_denied_by_default=True,
                lease_seconds=int(c.lease_default_s),
                image=c.image,
            ),
            limits_max=convert.limits_pb(c.max_limits),
            assurance=common_pb2.ASSURANCE_ENFORCED,
            lease_max_seconds=int(c.lease_max_s),
        )
