"""A built server's life: started in order, its background work, and the shutdown order.

Start: the engine checked (reconcile before the first call when it is up), then the pool,
the metrics listener and the gRPC server. Shutdown (SIGTERM): health NOT_SERVING, in-flight
calls drained for `shutdown_grace_s` (a second signal stops at once), transfers closed,
running workspaces snapshotted; the caller's AsyncExitStack then closes the parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AsyncExitStack

import grpc
from grpc_health.v1 import health

from sandboxd.api.engine_health import EngineMonitor
from sandboxd.config import TABLE, Config
from sandboxd.errors import ConfigError, SandboxError
from sandboxd.events import LeaseWarner
from sandboxd.events.stats import OomWatcher
from sandboxd.heap import HeapTrimmer
from sandboxd.metrics import MetricsServer
from sandboxd.server.parts import Parts
from sandboxd.server.transport import SERVICE_NAMES
from sandboxd.session_metrics import SessionSampler

log = logging.getLogger("sandboxd.server")  # the server's log lines keep their logger name

AUDIT_RETENTION_INTERVAL_S = 300.0


async def start(
    config: Config,
    parts: Parts,
    server: grpc.aio.Server,
    health_servicer: health.aio.HealthServicer,
    stack: AsyncExitStack,
) -> EngineMonitor:
    """Everything up to the first call served; the engine monitor, for the background."""
    p = parts

    async def on_engine_up() -> None:
        # The runtimes first: an operator may have registered runsc while it was away.
        with contextlib.suppress(SandboxError):
            await p.tiers.refresh(p.engine)
        await p.sessions.reconcile()
        await p.templates.recover()

    monitor = EngineMonitor(
        p.engine, health_servicer, on_engine_up, SERVICE_NAMES, report=p.metrics.engine_answers
    )
    await monitor.check()  # reconcile before the first call when the engine is up
    p.pool.start()  # after reconcile removed an earlier run's leftovers
    if config.metrics.served:

        async def refresh_metrics() -> None:
            p.metrics.set_session_counts(await p.store.count_by_state())

        metrics_server = MetricsServer(p.metrics, config.metrics.listen, refresh_metrics)
        try:
            await stack.enter_async_context(metrics_server)
        except OSError as exc:
            if config.metrics.listen != TABLE.default("metrics_listen"):
                raise ConfigError(f"metrics_listen {config.metrics.listen}: {exc}") from None
            # The default port may be taken by another server on this host: serving gRPC
            # matters more than serving its metrics, and the log says how to have both.
            log.warning(
                "metrics not served: %s is taken (%s); set metrics_listen to another address, "
                "or to off",
                config.metrics.listen,
                exc.strerror,
            )
    p.processes.expect_adoption()  # calls on processes wait for what the agents kept
    await server.start()
    return monitor


async def background(
    tg: asyncio.TaskGroup, config: Config, parts: Parts, monitor: EngineMonitor
) -> list[asyncio.Task[None]]:
    """The server's background work, in `tg`; the caller cancels it after the shutdown."""
    p = parts
    trimmer = HeapTrimmer.for_this_process()
    return [
        *([tg.create_task(trimmer.run())] if trimmer else []),
        tg.create_task(monitor.run(config.engine.engine_check_interval_s)),
        tg.create_task(p.sessions.run_reaper(config.leases.reaper_interval_s)),
        tg.create_task(p.sweeper.run()),
        tg.create_task(p.audit.run_retention(AUDIT_RETENTION_INTERVAL_S)),
        tg.create_task(OomWatcher(p.engine, p.store, p.hub, p.owner_id).run()),
        tg.create_task(p.processes.adopt_running(await p.store.all())),
        *(
            [tg.create_task(p.checkpoints.run(config.server.checkpoint_interval_s))]
            if config.server.checkpoint_interval_s > 0
            else []
        ),
        tg.create_task(
            LeaseWarner(p.store, p.hub, config.events.lease_warning_s).run(
                min(5.0, config.events.lease_warning_s / 4)
            )
        ),
        *(
            [tg.create_task(_session_sampler(p, config).run(config.metrics.session_interval_s))]
            if config.metrics.served and config.metrics.session_limit > 0
            else []
        ),
    ]


def _session_sampler(p: Parts, config: Config) -> SessionSampler:
    limit = config.metrics.session_limit
    gauges = p.metrics.session_gauges
    return SessionSampler(
        p.store,
        p.engine,
        gauges,
        limit=limit,
        egress_bytes=p.egress.bytes_moved,
        commands=p.commands,
    )


async def shut_down(
    config: Config,
    parts: Parts,
    server: grpc.aio.Server,
    health_servicer: health.aio.HealthServicer,
    force: asyncio.Event,
) -> None:
    """Drain, then save: no call in flight when the workspaces are snapshotted."""
    log.info("shutting down: draining calls for up to %.1f s", config.server.shutdown_grace_s)
    await health_servicer.enter_graceful_shutdown()
    stopping = asyncio.create_task(server.stop(config.server.shutdown_grace_s))
    forced = asyncio.create_task(force.wait())
    await asyncio.wait({stopping, forced}, return_when=asyncio.FIRST_COMPLETED)
    if not stopping.done():
        log.warning("second signal: stopping now")
        await server.stop(0)
    forced.cancel()
    await parts.transfer.close(0 if force.is_set() else config.server.shutdown_grace_s)
    if not force.is_set() and config.server.shutdown_snapshot_s > 0:
        # No call is in flight now: save every running workspace, so that an engine
        # restarting after us (a reboot) loses nothing.
        await parts.snapshots.snapshot_running(config.server.shutdown_snapshot_s, force)
