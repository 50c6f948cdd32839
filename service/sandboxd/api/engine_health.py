"""Health follows the engine: SERVING only while the engine answers (grpc health protocol).

The one place the engine's availability becomes the server's health: load balancers and
clients' health checks stop sending work to a server whose engine is gone, and `on_up` lets the
server reconcile whenever the engine comes back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from grpc_health.v1 import health, health_pb2

from sandboxd import disk_full
from sandboxd.engine import Engine
from sandboxd.errors import SandboxError

log = logging.getLogger(__name__)


class EngineMonitor:
    """Pings the engine; health is SERVING only while it answers."""

    def __init__(
        self,
        engine: Engine,
        health_servicer: health.aio.HealthServicer,
        on_up: Callable[[], object],
        service_names: Sequence[str],
        report: Callable[[bool], None] | None = None,
    ) -> None:
        self._report = report  # the engine_up gauge
        self._engine = engine
        self._health = health_servicer
        self._on_up = on_up
        self._names = ("", *service_names)
        self.up: bool | None = None

    async def check(self) -> bool:
        try:
            api_version = await self._engine.ping()
            up = True
        except SandboxError as exc:
            if self.up is not False:
                log.warning("engine unavailable: %s", exc)
            up = False
        if up != self.up:
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if up
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            for name in self._names:
                await self._health.set(name, status)
            if up:
                log.info("engine available (API %s)", api_version)
                try:
                    with disk_full.translated():
                        result = self._on_up()
                        if asyncio.iscoroutine(result):
                            await result
                except disk_full.ServerDiskFull as exc:
                    # The server's own disk full under the reconcile: logged, and tried again
                    # at the next check (the engine not yet taken as up), not the monitor's
                    # task ended, which would stop the server.
                    log.warning("reconcile after the engine came up: %s", exc)
                    return up
        self.up = up
        if self._report is not None:
            self._report(up)
        return up

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.check()
