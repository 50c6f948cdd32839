"""AdminService: what this server enforces, for operators and clients."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence

from sandboxd import __version__, images, tenancy, validation
from sandboxd.api import convert, egress_convert, image_convert, replies
from sandboxd.api.errors import Ctx, stream, unary
from sandboxd.api.pb_time import duration_pb
from sandboxd.config import Config
from sandboxd.egress.manager import EgressManager, FilterMode
from sandboxd.egress.policy import DEFAULT_QUOTAS, MAX_QUOTAS
from sandboxd.engine import Engine
from sandboxd.errors import Internal, ResourceExhausted, SandboxError
from sandboxd.isolation import Isolation, IsolationTiers
from sandboxd.pulls import PulledImage, Pulls
from sandboxd.sweeper import Sweeper
from sandboxd.v1 import admin_pb2, admin_pb2_grpc, common_pb2, images_pb2

_EGRESS_FILTER = {
    FilterMode.NO_NETWORK: admin_pb2.EGRESS_FILTER_NO_NETWORK,
    FilterMode.UNAVAILABLE: admin_pb2.EGRESS_FILTER_UNAVAILABLE,
}

# The major version of the API this server speaks: clients refuse a server of another one.
API_VERSION = "v1"
# What every server of this version offers; optional extras are added per configuration.
_BASE_FEATURES = (
    "pty",
    "background_processes",
    "snapshots",
    "image_snapshots",
    "archives",
    "archive_zstd",
    "image_pulls",
)


class AdminService(admin_pb2_grpc.AdminServiceServicer):
    def __init__(
        self,
        config: Config,
        engine: Engine,
        egress: EgressManager | None = None,
        sweeper: Sweeper | None = None,
        tiers: IsolationTiers | None = None,
        pulls: Pulls | None = None,
        memory_suspend: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        self._tiers = tiers  # None: runc only
        self._memory_suspend = memory_suspend  # why not ("" when it can); None: never
        self._pulls = pulls
        self._config = config
        self._engine = engine
        self._egress = egress
        self._sweeper = sweeper

    @unary
    async def Sweep(self, request: admin_pb2.SweepRequest, context: Ctx) -> admin_pb2.SweepResponse:
        if self._sweeper is None:  # pragma: no cover - server/main.py always passes one
            return admin_pb2.SweepResponse()
        r = await self._sweeper.sweep()
        return admin_pb2.SweepResponse(
            expired_sessions=r.expired_sessions,
            removed_containers=r.removed_containers,
            removed_images=r.removed_images,
            removed_networks=r.removed_networks,
        )

    @unary
    async def GetServerInfo(
        self, request: admin_pb2.GetServerInfoRequest, context: Ctx
    ) -> admin_pb2.GetServerInfoResponse:
        api_version = await self._engine.ping()
        c = self._config
        first_id = c.engine.host_uid_first
        return admin_pb2.GetServerInfoResponse(
            version=__version__,
            docker_api_version=api_version,
            security_defaults=admin_pb2.SecurityDefaults(
                # No one identity: each session gets its own from this block (uid = gid).
                user=f"{first_id}-{first_id + c.engine.host_uid_count - 1}",
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
                lease=duration_pb(c.leases.default_s),
            ),
            limits_max=convert.limits_pb(c.limits.max),
            assurance=common_pb2.ASSURANCE_ENFORCED,
            lease_max_seconds=int(c.leases.max_s),
            lease_max=duration_pb(c.leases.max_s),
            egress_filter=_EGRESS_FILTER[
                self._egress.filter_mode if self._egress else FilterMode.UNAVAILABLE
            ],
            proxy_quotas_default=egress_convert.quotas_pb(DEFAULT_QUOTAS),
            proxy_quotas_max=egress_convert.quotas_pb(MAX_QUOTAS),
            api_version=API_VERSION,
            features=await self._features(),
            isolation_tiers=(
                [convert.ISOLATION_PB[t] for t in self._tiers.available()]
                if self._tiers is not None
                else [common_pb2.ISOLATION_RUNC]
            ),
        )

    async def _features(self) -> list[str]:
        """Optional features this configuration has, so a client can check before relying.
        `memory_suspend` is asked of the engine each time (an operator may turn on its
        experimental mode, or register runsc, while the server runs)."""
        features = list(_BASE_FEATURES)
        gvisor = self._tiers is not None and Isolation.GVISOR in self._tiers.available()
        if gvisor and self._memory_suspend is not None:
            with contextlib.suppress(SandboxError):
                if not await self._memory_suspend():
                    features.append("memory_suspend")
        if self._egress is not None and self._egress.filter_mode is not FilterMode.UNAVAILABLE:
            features.append("egress")
        if self._config.metrics.served:
            features.append("metrics")
        return features

    # ----- images from a registry (sandboxd.pulls) ----------------------------------------

    def _image_patterns(self) -> tuple[str, ...]:
        return images.allowed_patterns(
            self._config.images.allowlist,
            tenancy.current_grants().image_allowlist,
            default_image=self._config.engine.image,
        )

    def _need_pulls(self) -> Pulls:
        if self._pulls is None:  # pragma: no cover - server/main.py always passes one
            raise Internal("this server does not pull images")
        return self._pulls

    @stream
    async def PullImage(
        self, request: images_pb2.PullImageRequest, context: Ctx
    ) -> AsyncGenerator[images_pb2.PullImageResponse, None]:
        pulls = self._need_pulls()
        image = validation.validate_image(request.image)
        images.check_image(image, self._image_patterns())  # before any registry traffic
        async for event in pulls.watch(image):
            yield image_convert.pull_event_pb(event)

    @unary
    async def ListImages(
        self, request: images_pb2.ListImagesRequest, context: Ctx
    ) -> images_pb2.ListImagesResponse:
        usable = await self._need_pulls().usable(self._image_patterns())
        bound = f"images {tenancy.current()!r}"

        def reply(
            chosen: Sequence[tuple[PulledImage, float]], token: str
        ) -> images_pb2.ListImagesResponse:
            return images_pb2.ListImagesResponse(
                images=[image_convert.image_info_pb(rec, last) for rec, last in chosen],
                next_page_token=token,
            )

        def whole(size: int, limit: int) -> ResourceExhausted:
            return replies.too_large(
                "the list of every image", size, limit, "ask for pages (page_size)"
            )

        return await replies.held_page(usable, _image_key, request, bound, reply, "images", whole)


def _image_key(usable: tuple[object, float]) -> str:
    """ListImages pages in name order; the digest keeps two tags of one name apart."""
    image = usable[0]
    return f"{getattr(image, 'name', '')} {getattr(image, 'digest', '')}"
