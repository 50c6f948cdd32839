"""Assemble and run the server: engine, store, domain, servicers, health, reflection.

Whoever creates a resource closes it: everything long-lived is entered into one
AsyncExitStack, background work runs in one TaskGroup, and SIGTERM drains in-flight calls
(health NOT_SERVING -> server.stop(grace) -> close the engine). A second SIGTERM forces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import signal
import socket
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from urllib.parse import urlsplit

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from sandboxd import tenancy
from sandboxd.agent.detached import for_engine as agent_processes
from sandboxd.agent.router import agent_settings
from sandboxd.api.admin_service import AdminService
from sandboxd.api.audit_interceptor import AuditInterceptor
from sandboxd.api.audit_service import AuditService
from sandboxd.api.auth import AuthInterceptor, LocalTenantInterceptor
from sandboxd.api.engine_health import EngineMonitor
from sandboxd.api.filesystem_service import FilesystemService
from sandboxd.api.limits import StreamCaps, StreamGuard
from sandboxd.api.observe import MetricsInterceptor
from sandboxd.api.process_service import ProcessService
from sandboxd.api.session_leases import renew_on_activity
from sandboxd.api.session_previews import PreviewSessionService
from sandboxd.api.snapshot_service import SnapshotService
from sandboxd.api.template_service import TemplateService
from sandboxd.archive import ArchiveIO
from sandboxd.audit import AuditLog, AuditStore, AuditWriter
from sandboxd.audit.egress import background_exit, egress_sink, server_lifecycle
from sandboxd.config import Config, listens_on_loopback
from sandboxd.dir_watch import DirWatches
from sandboxd.egress.addresses import Protected
from sandboxd.egress.manager import EgressManager, parse_static_hosts
from sandboxd.egress.resolver import Resolver
from sandboxd.engine import DockerEngine, Engine, docker_tls
from sandboxd.errors import ConfigError, SandboxError
from sandboxd.events import EventHub, LeaseWarner, ObservedStore
from sandboxd.events.stats import OomWatcher, StatsReader
from sandboxd.execution import Executor
from sandboxd.file_transfer import FileTransfer
from sandboxd.files import Files
from sandboxd.isolation import IsolationTiers, parse_tier, parse_tiers
from sandboxd.leases import ExpiryPolicy, LeaseTermsStore
from sandboxd.metrics import Metrics, MetricsServer
from sandboxd.pool import WarmPool
from sandboxd.previews import setup as previews_setup
from sandboxd.processes import ProcessManager
from sandboxd.pulls import Pulls, live_images
from sandboxd.secrets import vault
from sandboxd.secrets.setup import SecretsSetup
from sandboxd.sessions import SessionManager
from sandboxd.sessions.recovery import ENDED_RETENTION
from sandboxd.snapshot_store import SnapshotStore
from sandboxd.snapshots import SnapshotKeeper, Snapshots
from sandboxd.sweeper import Sweeper
from sandboxd.templates.builds import Templates, template_in_use
from sandboxd.templates.store import TemplateStore
from sandboxd.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    audit_pb2,
    audit_pb2_grpc,
    filesystem_pb2,
    filesystem_pb2_grpc,
    process_pb2,
    process_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    snapshot_pb2,
    snapshot_pb2_grpc,
    template_pb2,
    template_pb2_grpc,
)

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    session_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name,
    process_pb2.DESCRIPTOR.services_by_name["ProcessService"].full_name,
    filesystem_pb2.DESCRIPTOR.services_by_name["FilesystemService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
    snapshot_pb2.DESCRIPTOR.services_by_name["SnapshotService"].full_name,
    audit_pb2.DESCRIPTOR.services_by_name["AuditService"].full_name,
    template_pb2.DESCRIPTOR.services_by_name["TemplateService"].full_name,
)
AUDIT_RETENTION_INTERVAL_S = 300.0
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


def owner_id_for(config: Config) -> str:
    """This server's label value: configured, or made once and kept in the data directory."""
    if config.server.owner_id:
        return config.server.owner_id
    path = config.server.data_dir / "owner-id"
    if path.exists():
        return path.read_text().strip()
    owner = "sbx" + secrets.token_hex(4)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(owner + "\n")
    return owner


def _add_reflection(server: grpc.aio.Server) -> None:
    names = (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME, REFLECTION_V1)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    # v1 and v1alpha share one wire format: serve the same servicer under the v1 name too
    # (grpcio-reflection ships only v1alpha; grpcurl 1.8 asks v1alpha, newer tools ask v1).
    v1 = grpc.method_handlers_generic_handler(
        REFLECTION_V1,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))


async def serve(config: Config, *, ready: Callable[[int], None] | None = None) -> None:
    owner_id = owner_id_for(config)
    stop = asyncio.Event()
    force = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            force.set()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    engine_address = docker_tls.from_settings(config.engine)  # checked by validate already
    async with AsyncExitStack() as stack:
        metrics = Metrics()
        docker = await stack.enter_async_context(
            DockerEngine(
                config.engine.docker_host,
                config.engine.docker_pool_size,
                helper_path=config.engine.helper,
                keeper_user=config.engine.keeper_user,
                on_error=metrics.engine_error,
                gvisor_runtime=config.isolation.gvisor_runtime,
                address=engine_address,
                agent=agent_settings(config),
            )
        )
        engine: Engine = docker
        audit_store = (
            await stack.enter_async_context(AuditStore(config.server.data_dir / "audit.db"))
            if config.audit.enabled
            else None
        )
        audit = AuditWriter(
            audit_store,
            export_path=config.audit.export_path,
            max_age_s=config.audit.max_age_s,
            max_bytes=config.audit.max_bytes,
            batch_window_s=config.audit.batch_window_s,
            on_event=lambda e: metrics.audited(e.tenant, e.kind, e.attributes),
        )
        audit.start()
        stack.push_async_callback(audit.close)  # after the gRPC server stopped: flush, then close
        hub = EventHub(config.events.window)
        tiers = IsolationTiers(
            parse_tier(config.isolation.default), parse_tiers(config.isolation.allowed)
        )
        store = await stack.enter_async_context(
            ObservedStore(config.server.data_dir / "sessions.db", hub, server_lifecycle(audit))
        )
        pool = WarmPool.for_config(engine, config, owner_id, metrics)
        stack.push_async_callback(pool.close)  # after the gRPC server stopped, before the engine
        # Proxies close before the engine. Sandboxes have no network: their agents carry egress
        # over the channels to these proxies (docs/agent.md).
        egress = await stack.enter_async_context(
            EgressManager(
                engine,
                owner_id,
                proxy_port=config.egress.proxy_port,
                channels=docker.agents.open if docker.agents is not None else None,
                on_decision=metrics.proxy_decision,
                on_event=egress_sink(audit, hub),
                resolver=Resolver(
                    parse_static_hosts(config.egress.proxy_hosts),
                    threads=config.egress.resolver_threads,
                    timeout_s=config.egress.dns_timeout_s,
                ),
                protected=await _protected(config),
                private_networks_granted=_private_networks_grant(config),
                secrets=SecretsSetup(
                    vault.configure(config.egress.secrets_key_file, config.egress.secrets_file),
                    config.egress.upstream_ca_file,
                    metrics.secret_event,
                ),
            )
        )
        if docker.agents is not None:
            docker.agents.egress = egress  # the agents' egress streams go to these proxies
        detached = agent_processes(engine) if config.agent.detached_processes else None
        executor = Executor(engine, detached=detached)
        stack.push_async_callback(executor.close)
        processes = ProcessManager(executor, on_exit=background_exit(audit, hub))
        stack.push_async_callback(processes.close)  # before executor.close awaits the kills
        files = Files(engine)
        archive = ArchiveIO(
            engine, files, config.archive.max_members, spool_dir=config.server.data_dir / "spool"
        )
        snapshot_store = await SnapshotStore(store.db, config.server.data_dir / "snapshots").open()
        keeper = SnapshotKeeper(snapshot_store, archive, engine, owner_id)
        terms = await LeaseTermsStore(store.db).open()
        pulls = Pulls(config, engine, live_images=lambda: live_images(store))
        stack.push_async_callback(pulls.close)
        templates = Templates(
            config,
            engine,
            await TemplateStore(store.db).open(),
            config.server.data_dir / "spool",
            in_use=functools.partial(template_in_use, store),
        )
        stack.push_async_callback(templates.close)
        preview_parts = await previews_setup.prepare(config, store)
        sessions = SessionManager(
            config,
            engine,
            store,
            owner_id,
            keeper,
            pool=pool,
            egress=egress,
            on_session_end=[processes.end_session, preview_parts.end_session],
            on_expiry=ExpiryPolicy(terms, keeper, store, suspend_for=ENDED_RETENTION),
            tiers=tiers,
            pulls=pulls,
            templates=templates,
        )
        snapshots = Snapshots(keeper, snapshot_store, sessions, engine, store)
        previews = await stack.enter_async_context(
            previews_setup.serve(
                preview_parts,
                config,
                engine=engine,
                store=store,
                sessions=sessions,
                metrics_registry=metrics.registry,
                audit=audit.record_nowait,
            )
        )

        server = grpc.aio.server(
            interceptors=[
                # Outermost: times every stream's reads and writes, whatever runs inside.
                StreamGuard(config.tenancy.stream_idle_timeout_s),
                MetricsInterceptor(metrics),
                *_interceptors(config),
                AuditInterceptor(
                    audit, hub, functools.partial(renew_on_activity, sessions, terms)
                ),  # inside authentication: the tenant is known
                # Innermost: the tenant is known here (set by authentication, or the default).
                StreamCaps(config.tenancy.max_streams),
            ],
            options=[
                ("grpc.max_receive_message_length", config.max_message_bytes),
                ("grpc.max_send_message_length", config.max_message_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        stats = StatsReader(engine, hub, egress.bytes_moved)
        session_pb2_grpc.add_SessionServiceServicer_to_server(
            PreviewSessionService(sessions, hub, stats, terms, previews), server
        )
        process_pb2_grpc.add_ProcessServiceServicer_to_server(
            ProcessService(sessions, executor, config, processes), server
        )
        transfer = FileTransfer(files.helper, config.tenancy.stream_idle_timeout_s)
        filesystem_pb2_grpc.add_FilesystemServiceServicer_to_server(
            FilesystemService(
                sessions, files, transfer, DirWatches(files.helper, sessions, config.watch)
            ),
            server,
        )
        snapshot_pb2_grpc.add_SnapshotServiceServicer_to_server(
            SnapshotService(sessions, archive, snapshots), server
        )
        sweeper = Sweeper(sessions, engine, owner_id, snapshots, pulls=pulls)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminService(config, engine, egress, sweeper, tiers=tiers, pulls=pulls), server
        )
        audit_pb2_grpc.add_AuditServiceServicer_to_server(
            AuditService(AuditLog(audit_store)), server
        )
        template_pb2_grpc.add_TemplateServiceServicer_to_server(
            TemplateService(templates, config.tenancy.stream_idle_timeout_s), server
        )
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        _add_reflection(server)

        try:
            port = _add_port(server, config)
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen on {config.server.listen}: {exc}") from None
        if port == 0:
            raise ConfigError(
                f"cannot listen on {config.server.listen} (address in use or invalid)"
            )

        async def on_engine_up() -> None:
            # The runtimes first: an operator may have registered runsc while it was away.
            with contextlib.suppress(SandboxError):
                await tiers.refresh(engine)
            await sessions.reconcile()
            await templates.recover()

        monitor = EngineMonitor(engine, health_servicer, on_engine_up, SERVICE_NAMES)
        await monitor.check()  # reconcile before the first call when the engine is up
        pool.start()  # after reconcile removed an earlier run's leftovers
        if config.metrics.listen:

            async def refresh_metrics() -> None:
                metrics.set_session_counts(await store.count_by_state())

            await stack.enter_async_context(
                MetricsServer(metrics, config.metrics.listen, refresh_metrics)
            )
        await server.start()
        host = config.server.listen.rpartition(":")[0]
        log.info("sandboxd listening on %s:%d (owner id %s)", host, port, owner_id)
        if ready is not None:
            ready(port)

        async with asyncio.TaskGroup() as tg:
            background = [
                tg.create_task(monitor.run(config.engine.engine_check_interval_s)),
                tg.create_task(sessions.run_reaper(config.leases.reaper_interval_s)),
                tg.create_task(sweeper.run()),
                tg.create_task(audit.run_retention(AUDIT_RETENTION_INTERVAL_S)),
                tg.create_task(OomWatcher(engine, store, hub, owner_id).run()),
                tg.create_task(processes.adopt_running(await store.all())),
                tg.create_task(
                    LeaseWarner(store, hub, config.events.lease_warning_s).run(
                        min(5.0, config.events.lease_warning_s / 4)
                    )
                ),
            ]
            await stop.wait()
            log.info(
                "shutting down: draining calls for up to %.1f s", config.server.shutdown_grace_s
            )
            await health_servicer.enter_graceful_shutdown()
            stopping = asyncio.create_task(server.stop(config.server.shutdown_grace_s))
            forced = asyncio.create_task(force.wait())
            await asyncio.wait({stopping, forced}, return_when=asyncio.FIRST_COMPLETED)
            if not stopping.done():
                log.warning("second signal: stopping now")
                await server.stop(0)
            forced.cancel()
            await transfer.close(0 if force.is_set() else config.server.shutdown_grace_s)
            if not force.is_set() and config.server.shutdown_snapshot_s > 0:
                # No call is in flight now: save every running workspace, so that an engine
                # restarting after us (a reboot) loses nothing.
                await snapshots.snapshot_running(config.server.shutdown_snapshot_s, force)
            for task in background:
                task.cancel()
    log.info("stopped")


async def _protected(config: Config) -> Protected:
    """Addresses the egress proxy never dials: the listeners' and the engine's (by name too)."""
    hosts = [config.server.listen.rpartition(":")[0], config.metrics.listen.rpartition(":")[0]]
    if config.engine.docker_host.startswith("tcp://"):
        engine_host = urlsplit(config.engine.docker_host).hostname or ""
        hosts.append(engine_host)
        with contextlib.suppress(OSError, UnicodeError):
            infos = await asyncio.to_thread(socket.getaddrinfo, engine_host, None)
            hosts += [str(info[4][0]) for info in infos]
    return Protected.of(hosts)


def _private_networks_grant(config: Config) -> Callable[[str], bool]:
    """tenant -> may its sessions reach private networks (tokens-file grant, else setting)."""
    path = config.tenancy.tokens_file
    grants = tenancy.load_tokens(path).grants_of if path else (lambda _: tenancy.LOCAL_GRANTS)
    setting = config.egress.private_networks
    return lambda tenant: tenancy.private_networks_allowed(setting, grants(tenant))


def _interceptors(config: Config) -> list[grpc.aio.ServerInterceptor]:
    """Bearer-token authentication when a tokens file is configured; else one tenant."""
    if config.tenancy.tokens_file is None:
        if not listens_on_loopback(config.server.listen):
            log.warning(
                "INSECURE: serving %s with no authentication (allow_insecure_public_listen): "
                "anyone who can reach this port can run commands",
                config.server.listen,
            )
        return [LocalTenantInterceptor(config.egress.private_networks)]
    tokens = tenancy.load_tokens(config.tenancy.tokens_file)
    log.info(
        "authentication on: %d token(s) for %d tenant(s)",
        len(tokens.entries),
        len(tokens.tenants),
    )
    if config.tenancy.tls_cert is None and not listens_on_loopback(config.server.listen):
        log.warning(
            "bearer tokens on %s travel in plaintext: set tls_cert and tls_key",
            config.server.listen,
        )
    return [AuthInterceptor(tokens, config.egress.private_networks)]


def _add_port(server: grpc.aio.Server, config: Config) -> int:
    """TLS when a certificate is configured, mutual TLS when a client CA is too."""
    if config.tenancy.tls_cert is None or config.tenancy.tls_key is None:
        return int(server.add_insecure_port(config.server.listen))
    try:
        key, cert = config.tenancy.tls_key.read_bytes(), config.tenancy.tls_cert.read_bytes()
        ca = config.tenancy.tls_client_ca.read_bytes() if config.tenancy.tls_client_ca else None
    except OSError as exc:
        raise ConfigError(f"cannot read TLS files: {exc}") from None
    credentials = grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )
    log.info("TLS on (%s)", "client certificates required" if ca else "server certificate only")
    return int(server.add_secure_port(config.server.listen, credentials))


def write_port_file(path: Path, port: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{port}\n")
    tmp.replace(path)
