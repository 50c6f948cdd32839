"""AdminService.Sweep and its periodic twin: expire ended leases, remove what no session claims.

Only objects labelled with this server's owner id are ever considered (the engine is asked
with that label filter), so containers of other servers and of people are never touched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from sandboxd import disk_full, domain_events, tenancy
from sandboxd.engine.protocol import Engine
from sandboxd.errors import SandboxError
from sandboxd.pulls import Pulls
from sandboxd.sessions import SessionManager
from sandboxd.snapshots import Snapshots
from sandboxd.volumes.service import Volumes

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 60.0


@dataclasses.dataclass(frozen=True)
class SweepResult:
    expired_sessions: int
    removed_containers: int
    removed_images: int = 0
    removed_networks: int = 0  # an older server's session networks (sessions/leftovers.py)
    removed_volume_disks: int = 0  # disks no volume owns (a crash mid-create, a failed removal)
    removed_snapshot_disks: int = 0  # disk snapshots' copies no record holds (the same causes)


class Sweeper:
    def __init__(
        self,
        sessions: SessionManager,
        engine: Engine,
        owner_id: str,
        snapshots: Snapshots,
        *,
        pulls: Pulls | None = None,
        observer: domain_events.Observer = domain_events.SILENT,
        volumes: Volumes | None = None,
    ) -> None:
        self._volumes = volumes
        self._pulls = pulls  # pulled images unused for image_unused_after_s go too
        self._observer = observer  # the metrics count every sweep; the audit, the Sweep RPC's
        self._snapshots = snapshots
        self._sessions = sessions
        self._engine = engine
        self._owner_id = owner_id
        self._lock = asyncio.Lock()  # one sweep at a time; a second caller waits for its own

    async def sweep(self) -> SweepResult:
        async with self._lock:
            expired = await self._sessions.reap_once()
            containers = await self._owned()
            # Removes unclaimed containers, notes lost containers, and an older server's
            # networks until none is left (one still in use goes once its sandbox has).
            networks = await self._sessions.reconcile()
            containers_after = await self._owned()
            images = await self._snapshots.sweep_images()
            if self._pulls is not None:
                images += await self._pulls.sweep()
            disks = await self._volumes.sweep() if self._volumes is not None else 0
            snapshot_disks = await self._snapshots.sweep_disks()
            result = SweepResult(
                expired_sessions=expired,
                removed_containers=len(containers - containers_after),
                removed_images=images,
                removed_networks=networks,
                removed_volume_disks=disks,
                removed_snapshot_disks=snapshot_disks,
            )
            self._observer.emit(
                domain_events.Swept(
                    tenancy.current(),
                    result.expired_sessions,
                    result.removed_containers,
                    result.removed_images,
                    result.removed_networks,
                    result.removed_volume_disks,
                )
            )
            return result

    async def _owned(self) -> set[str]:
        """Ids of the containers labelled with this server's owner id."""
        found = await self._engine.list_sandboxes(self._owner_id)
        return {s.sandbox_id for s in found}

    async def run(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                with disk_full.translated():
                    result = await self.sweep()
            except SandboxError as exc:
                log.warning("sweep: %s", exc)
                continue
            if any(dataclasses.astuple(result)):
                log.info(
                    "sweep: %d lease(s) expired, %d container(s), %d image(s) and "
                    "%d network(s) removed",
                    result.expired_sessions,
                    result.removed_containers,
                    result.removed_images,
                    result.removed_networks,
                )
