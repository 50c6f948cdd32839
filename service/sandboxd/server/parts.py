"""The server's collaborators, built from its configuration: engine, stores, managers.

Whoever creates a resource closes it: each long-lived part is entered into the caller's
AsyncExitStack (or leaves a close callback there) as it is made, so the stack closes them in
the reverse order: the audit writer, its hashing threads, the pool, the proxies and the engine
after the gRPC server stopped (sandboxd.server.run), and the engine last.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import socket
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry.trace import Tracer

from sandboxd import domain_events, tenancy
from sandboxd import engine_address as docker_tls
from sandboxd.admission import ChannelShares, FairShares, shares_of
from sandboxd.agent.router import AgentRouter, agent_settings
from sandboxd.api.session_leases import renew_on_activity
from sandboxd.archive import ArchiveIO
from sandboxd.audit import AuditStore, AuditWriter
from sandboxd.audit.egress import egress_into
from sandboxd.audit.subscriber import AuditSubscriber
from sandboxd.budget import ByteBudget
from sandboxd.checkpoints import Checkpoints
from sandboxd.commands import SandboxCommands
from sandboxd.commands.sandbox import sandbox_side
from sandboxd.config import Config
from sandboxd.digest import hashing_threads
from sandboxd.egress.addresses import Protected
from sandboxd.egress.manager import EgressManager, parse_static_hosts
from sandboxd.egress.resolver import Resolver
from sandboxd.engine import DockerEngine, Engine
from sandboxd.engine.docker_volumes import DockerVolumeDisks
from sandboxd.events import EventHub, ObservedStore
from sandboxd.events.feed import FeedSubscriber
from sandboxd.execution import Executor
from sandboxd.file_transfer import FileTransfer
from sandboxd.files import Files
from sandboxd.host_ids import HostIds
from sandboxd.isolation import IsolationTiers, parse_tier, parse_tiers
from sandboxd.leases import ExpiryPolicy, LeaseTermsStore
from sandboxd.leases.activity import ActivityRenewal
from sandboxd.metrics import Metrics
from sandboxd.pool import WarmPool
from sandboxd.previews import setup as previews_setup
from sandboxd.previews.publishing import Previews
from sandboxd.processes import ProcessManager
from sandboxd.pulls import Pulls, live_images
from sandboxd.secrets import vault
from sandboxd.secrets.setup import SecretsSetup
from sandboxd.sessions import SessionManager
from sandboxd.sessions.memory_suspension import MemoryOptions
from sandboxd.sessions.recovery import ENDED_RETENTION
from sandboxd.snapshot_store import SnapshotStore
from sandboxd.snapshots import SnapshotKeeper, Snapshots
from sandboxd.sweeper import Sweeper
from sandboxd.templates.builds import Templates, template_in_use
from sandboxd.templates.builtin_images import BuiltinImages, ScriptRunner
from sandboxd.templates.quota import ImageQuota
from sandboxd.templates.store import TemplateStore
from sandboxd.token_file import TokenFile
from sandboxd.tracing import provider_for, traced, tracer_of
from sandboxd.volumes.claims import VolumeClaims
from sandboxd.volumes.disk_quota import DiskQuota
from sandboxd.volumes.porting import SandboxPorter
from sandboxd.volumes.service import Volumes
from sandboxd.volumes.store import VolumeStore


@dataclass(frozen=True)
class Parts:
    """Everything the servicers and the background work are given."""

    owner_id: str
    metrics: Metrics
    engine: Engine
    commands: SandboxCommands  # every command in a sandbox (the agent first, engine exec after)
    router: AgentRouter | None  # the agents' channels; None: the agent is off
    audit_store: AuditStore | None
    audit: AuditWriter
    hashers: concurrent.futures.Executor  # hash callers' archive transfers (digest.Digest)
    hub: EventHub
    observer: domain_events.FanOut  # the domain's events; audit, feed, leases, metrics listen
    tiers: IsolationTiers
    store: ObservedStore
    pool: WarmPool
    egress: EgressManager
    executor: Executor
    processes: ProcessManager
    files: Files
    archive: ArchiveIO
    terms: LeaseTermsStore
    pulls: Pulls
    templates: Templates
    sessions: SessionManager
    snapshots: Snapshots
    volumes: Volumes
    checkpoints: Checkpoints
    previews: Previews
    transfer: FileTransfer
    sweeper: Sweeper
    tokens: TokenFile | None  # the tenants' tokens, reloaded on SIGHUP; None: one local tenant
    tracer: Tracer  # spans of every RPC (TracingInterceptor) and engine and agent call
    shares: FairShares | None  # tenants' fair shares (calls, command output); None: off


async def build(config: Config, owner_id: str, stack: AsyncExitStack) -> Parts:
    metrics = Metrics()
    path = config.tenancy.tokens_file
    tokens = TokenFile(path) if path is not None else None
    engine_address = docker_tls.from_settings(config.engine)  # checked by validate already
    docker = await stack.enter_async_context(
        DockerEngine(
            config.engine.docker_host,
            config.engine.docker_pool_size,
            helper_path=config.engine.helper,
            keeper_user=config.engine.keeper_user,
            on_error=metrics.engine_error,
            gvisor_runtime=config.isolation.gvisor_runtime,
            address=engine_address,
            agent=config.agent.enabled,
            owner_id=owner_id,
            disk_tool_image=config.engine.disk_tool_image,
            # The agent's socket is root's (helper/agent_sock.c): a server of another uid could
            # not connect to it.
            agent_socket=config.agent.socket and os.geteuid() == 0,
        )
    )
    provider = provider_for(config.metrics.otlp_endpoint)
    if provider is not None:  # flushes what is left when the server stops (off the loop)
        stack.push_async_callback(asyncio.to_thread, provider.shutdown)
    tracer = tracer_of(provider)
    traced_docker = traced(docker, tracer, "engine")
    shares = shares_of(config.admission, metrics.registry)
    # The sandbox side: the router over the engine's agent port (each session's channel
    # reading within its tenant's share), the lifecycle that keeps the channels in step, and
    # the one owner of commands over both. Its channels close before the engine.
    side = sandbox_side(
        traced_docker,
        traced_docker,
        agent_settings(config),
        shares=ChannelShares(shares, partitioned=tokens is not None)
        if shares is not None
        else None,
        tracer=tracer,
    )
    stack.push_async_callback(side.close)
    engine: Engine = side.engine
    commands = side.commands
    router = side.router
    audit_store = (
        await stack.enter_async_context(AuditStore(config.server.data_dir / "audit.db"))
        if config.audit.enabled
        else None
    )
    # Before the writer, so closed after it: the last call's digest is hashed and its record
    # written before these threads stop.
    hashers = await stack.enter_async_context(hashing_threads())
    audit = AuditWriter(
        audit_store,
        export_path=config.audit.export_path,
        max_age_s=config.audit.max_age_s,
        max_bytes=config.audit.max_bytes,
        batch_window_s=config.audit.batch_window_s,
        on_unrecorded=metrics.audit_unrecorded_events,
    )
    audit.start()
    stack.push_async_callback(audit.close)  # after the gRPC server stopped: flush, then close
    hub = EventHub(config.events.window)
    # One observer for the whole domain; its subscribers are registered here, the lease
    # renewal once the sessions exist (docs/architecture.md: the life of a request).
    observer = domain_events.FanOut([AuditSubscriber(audit), FeedSubscriber(hub), metrics.observe])
    tiers = IsolationTiers(
        parse_tier(config.isolation.default), parse_tiers(config.isolation.allowed)
    )
    store = await stack.enter_async_context(
        ObservedStore(config.server.data_dir / "sessions.db", hub, observer)
    )
    host_ids = HostIds.for_config(config, store)  # sessions' and warm containers' own uids
    pool = WarmPool.for_config(engine, config, owner_id, host_ids, metrics)
    stack.push_async_callback(pool.close)  # after the gRPC server stopped, before the engine
    # Proxies close before the engine. Sandboxes have no network: their agents carry egress
    # over the channels to these proxies (docs/agent.md).
    egress = await stack.enter_async_context(
        EgressManager(
            commands,
            owner_id,
            proxy_port=config.egress.proxy_port,
            channels=router.open if router is not None else None,
            on_decision=metrics.proxy_decision,
            on_event=egress_into(observer),
            resolver=Resolver(
                parse_static_hosts(config.egress.proxy_hosts),
                threads=config.egress.resolver_threads,
                timeout_s=config.egress.dns_timeout_s,
            ),
            protected=await _protected(config),
            private_networks_granted=_private_networks_grant(config, tokens),
            secrets=SecretsSetup(
                vault.configure(config.egress.secrets_key_file, config.egress.secrets_file),
                config.egress.upstream_ca_file,
                metrics.secret_event,
            ),
        )
    )
    if router is not None:  # the agents' egress streams go to these proxies
        router.egress = egress
    detached = commands.detached if config.agent.detached_processes else None
    executor = Executor(commands, detached=detached)
    stack.push_async_callback(executor.close)
    processes = ProcessManager(
        executor, observer, output_budget=config.limits.process_output_buffer_bytes
    )
    stack.push_async_callback(processes.close)  # before executor.close awaits the kills
    files = Files(
        commands,
        buffers=ByteBudget(config.limits.file_buffer_bytes),
        listing_bytes=config.limits.listing_bytes,
        observer=observer,
    )
    archive = ArchiveIO(engine, files, config.archive.max_members)
    snapshot_store = await SnapshotStore(store.db, config.server.data_dir / "snapshots").open()
    keeper = SnapshotKeeper(snapshot_store, archive, engine, owner_id)
    terms = await LeaseTermsStore(store.db).open()
    pulls = Pulls(config, engine, live_images=lambda: live_images(store), observer=observer)
    stack.push_async_callback(pulls.close)
    template_store = await TemplateStore(store.db).open()
    image_quota = ImageQuota(
        config.tenancy.max_image_bytes,
        engine,
        template_store,
        snapshot_store.images_of,
        checkpoint_bytes=snapshot_store.memory_bytes,
    )
    templates = Templates(
        config,
        engine,
        template_store,
        config.server.data_dir / "spool",
        in_use=functools.partial(template_in_use, store),
        quota=image_quota,
        builtins=_builtin_images(config, engine),
        observer=observer,
    )
    stack.push_async_callback(templates.close)
    preview_parts = await previews_setup.prepare(config, store)
    volume_store = await VolumeStore(store.db).open()
    porter_runs: set[str] = set()  # volume porters and hand-overs in flight
    disks = DockerVolumeDisks(
        docker.docker,
        docker.disks,
        owner_id=owner_id,
        image=config.engine.image,
        running=porter_runs,
    )
    claims = VolumeClaims(volume_store, store, disks)
    disk_quota = DiskQuota(config.tenancy.max_disk_bytes, store, volume_store, snapshot_store)
    sessions = SessionManager(
        config,
        engine,
        store,
        owner_id,
        keeper,
        pool=pool,
        egress=egress,
        on_session_end=[processes.end_session, preview_parts.end_session],
        on_expiry=ExpiryPolicy(
            terms, keeper, store, suspend_for=ENDED_RETENTION, on_expired=metrics.lease_expired
        ),
        tiers=tiers,
        pulls=pulls,
        templates=templates,
        host_ids=host_ids,
        volumes=claims,
        memory=MemoryOptions(
            checkpoints=snapshot_store,  # beside the snapshots
            on_resume=[processes.adopt],  # the agent kept them in its memory
            room=image_quota.check_checkpoint_room,
        ),
        observer=observer,
        commands=commands,
        disk_quota=disk_quota,
    )
    if shares is not None and sessions.cpu is not None:
        # A tenant whose commands write without pause weighs the least at the kernel meanwhile.
        shares.on_busy = sessions.cpu.demote
        stack.push_async_callback(sessions.cpu.close)
    observer.subscribe(ActivityRenewal(functools.partial(renew_on_activity, sessions, terms)))
    volumes = Volumes(
        config.volumes,
        volume_store,
        claims,
        disks,
        owner_id,
        SandboxPorter(
            engine,
            archive,
            disks,
            host_ids,
            owner_id=owner_id,
            image=config.engine.image,
            limits=config.limits.default,
            running=porter_runs,
        ),
        observer,
        disk_quota=disk_quota,
    )
    snapshots = Snapshots(
        keeper,
        snapshot_store,
        sessions,
        engine,
        store,
        quota=image_quota,
        max_image_bytes=config.images.max_image_bytes,
        observer=observer,
        disk_quota=disk_quota,
    )
    previews = await stack.enter_async_context(
        previews_setup.serve(
            preview_parts,
            config,
            commands=commands,
            router=router,
            store=store,
            sessions=sessions,
            metrics_registry=metrics.registry,
            audit=audit.record_nowait,
            observer=observer,
        )
    )
    return Parts(
        owner_id=owner_id,
        metrics=metrics,
        engine=engine,
        commands=commands,
        router=router,
        audit_store=audit_store,
        audit=audit,
        hashers=hashers,
        hub=hub,
        observer=observer,
        tiers=tiers,
        store=store,
        pool=pool,
        egress=egress,
        executor=executor,
        processes=processes,
        files=files,
        archive=archive,
        terms=terms,
        pulls=pulls,
        templates=templates,
        sessions=sessions,
        snapshots=snapshots,
        checkpoints=Checkpoints(snapshots, store, snapshot_store),
        previews=previews,
        transfer=FileTransfer(files.helper, config.tenancy.stream_idle_timeout_s, observer),
        sweeper=Sweeper(
            sessions,
            engine,
            owner_id,
            snapshots,
            pulls=pulls,
            observer=observer,
            volumes=volumes,
        ),
        volumes=volumes,
        tokens=tokens,
        tracer=tracer,
        shares=shares,
    )


async def _protected(config: Config) -> Protected:
    """Addresses the egress proxy never dials: the listeners' and the engine's (by name too)."""
    hosts = [config.server.listen.rpartition(":")[0]]
    if config.metrics.served:
        hosts.append(config.metrics.listen.rpartition(":")[0])
    if config.engine.docker_host.startswith("tcp://"):
        engine_host = urlsplit(config.engine.docker_host).hostname or ""
        hosts.append(engine_host)
        with contextlib.suppress(OSError, UnicodeError):
            infos = await asyncio.to_thread(socket.getaddrinfo, engine_host, None)
            hosts += [str(info[4][0]) for info in infos]
    return Protected.of(hosts)


def _private_networks_grant(config: Config, tokens: TokenFile | None) -> Callable[[str], bool]:
    """tenant -> may its sessions reach private networks (tokens-file grant, else setting);
    asked at each decision, so a reloaded tokens file counts from then on."""
    setting = config.egress.private_networks

    def granted(tenant: str) -> bool:
        grants = tokens.grants_of(tenant) if tokens is not None else tenancy.LOCAL_GRANTS
        return tenancy.private_networks_allowed(setting, grants)

    return granted


def _builtin_images(config: Config, engine: Engine) -> BuiltinImages | None:
    """Who builds the built-in templates' images this engine lacks (None: only `make`)."""
    if not config.templates.build_builtins:
        return None
    env = dict(os.environ)
    if config.engine.docker_host:  # the recipes' `docker import` reaches the server's engine
        env["DOCKER_HOST"] = config.engine.docker_host
    images = {
        "busybox": config.engine.image,
        "python": config.templates.python_image,
        "base": config.templates.base_image,
    }
    return BuiltinImages(images, engine, ScriptRunner(env))
