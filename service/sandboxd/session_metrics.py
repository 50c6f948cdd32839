"""Per-session resource gauges on the metrics endpoint, with a cap on the sessions labelled.

A scrape must stay cheap and the number of series bounded whatever the number of sessions, so
the readings are not taken at scrape time: a background sampler reads, every
`metrics_session_interval_s`, the engine's stats, the workspace's use and the egress proxy's
bytes of at most `metrics_session_limit` running sessions (the oldest first, so a session keeps
its series from one sampling to the next), sets one series per session and metric, and removes
the series of every session it did not read this time (ended, or past the cap). How many running
sessions were left out is itself a gauge. The readings raise no session events (GetSessionStats
does that): sampling does not change what a session's feed says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from sandboxd.commands import SandboxCommands
from sandboxd.engine.protocol import Engine
from sandboxd.errors import SandboxError
from sandboxd.events.stats import workspace_used
from sandboxd.models import Session, SessionState
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)

CONCURRENCY = 4  # readings at once: each is an engine stats call and a `df` exec
LABELS = ("tenant", "session")


class SessionGauges:
    """The gauges, on the server's registry; series only for the sessions last sampled."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.cpu = Gauge(
            "sandboxd_session_cpu_seconds",
            "CPU time a session's container used since it started",
            LABELS,
            registry=r,
        )
        self.memory = Gauge(
            "sandboxd_session_memory_bytes",
            "Memory a session's container holds",
            LABELS,
            registry=r,
        )
        self.disk = Gauge(
            "sandboxd_session_workspace_bytes",
            "Bytes used in a session's /workspace",
            LABELS,
            registry=r,
        )
        self.network = Gauge(
            "sandboxd_session_egress_bytes",
            "Bytes a session's egress proxy carried both ways (sandboxes have no interface)",
            LABELS,
            registry=r,
        )
        self.omitted = Gauge(
            "sandboxd_session_series_omitted",
            "Running sessions without series of their own: past metrics_session_limit",
            registry=r,
        )
        self._labelled: set[tuple[str, str]] = set()

    def replace(self, readings: dict[tuple[str, str], tuple[float, int, int, int]]) -> None:
        """Set this sampling's series and remove every other session's."""
        for key in self._labelled - readings.keys():
            for gauge in (self.cpu, self.memory, self.disk, self.network):
                with contextlib.suppress(KeyError):
                    gauge.remove(*key)
        for key, (cpu, memory, disk, network) in readings.items():
            self.cpu.labels(*key).set(cpu)
            self.memory.labels(*key).set(memory)
            self.disk.labels(*key).set(disk)
            self.network.labels(*key).set(network)
        self._labelled = set(readings)


class SessionSampler:
    def __init__(
        self,
        store: SessionStore,
        engine: Engine,
        gauges: SessionGauges,
        *,
        limit: int,
        egress_bytes: Callable[[str], int] | None = None,
        commands: SandboxCommands,
    ) -> None:
        self._store = store
        self._engine = engine
        self._commands = commands  # the workspace's `df`
        self._gauges = gauges
        self._limit = limit
        self._egress_bytes = egress_bytes

    async def sample(self) -> None:
        running = [s for s in await self._store.all() if s.state is SessionState.RUNNING]
        running = [s for s in running if s.container_id]
        running.sort(key=lambda s: (s.created_at, s.session_id))
        chosen = running[: self._limit]
        gate = asyncio.Semaphore(CONCURRENCY)
        readings: dict[tuple[str, str], tuple[float, int, int, int]] = {}

        async def read(session: Session) -> None:
            async with gate:
                try:
                    raw = await self._engine.sandbox_stats(session.container_id)
                except SandboxError:
                    return  # gone between the listing and the reading: no series
                used = 0
                with contextlib.suppress(SandboxError, TimeoutError, ValueError):
                    used = await workspace_used(self._commands, session)
                egress = raw.network_bytes
                if self._egress_bytes is not None:
                    egress += self._egress_bytes(session.session_id)
                key = (session.tenant, session.session_id)
                readings[key] = (raw.cpu_seconds, raw.memory_bytes, used, egress)

        async with asyncio.TaskGroup() as tg:
            for session in chosen:
                tg.create_task(read(session))
        self._gauges.replace(readings)
        self._gauges.omitted.set(len(running) - len(chosen))

    async def run(self, interval_s: float) -> None:
        while True:
            try:
                await self.sample()
            except Exception:  # the store or the engine: the next sampling tries again
                log.exception("per-session metrics: sampling failed")
            await asyncio.sleep(interval_s)
