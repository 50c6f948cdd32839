"""Periodic checkpoints: a snapshot of every running session's workspace, taken by the server
every `checkpoint_interval_s` (0, the default: never), so that a sandbox that dies (its agent
OOM-killed, its container killed, the engine or host restarted) is rebuilt from a state at most
one interval old rather than from the caller's last CreateSnapshot, or not at all. Disk
workspaces take none: their disk outlives the sandbox, which is rebuilt on it.

Off by default because it is not free and a timer knows no consistent point: each checkpoint
tars the whole workspace (CPU and disk of the server's host, per session per interval), holds
the session's file calls for the time of the tar (the exclusive workspace gate, as for
CreateSnapshot), and keeps a snapshot the tenant did not ask for. A caller who cares takes
CreateSnapshot at the moments that matter; an operator whose sandboxes die often (tight memory
limits) turns this on. Each session keeps one checkpoint: the previous one goes once the new
one is recorded, never before.
"""

from __future__ import annotations

import asyncio
import logging

from sandboxd import disk_full, tenancy
from sandboxd.errors import SandboxError
from sandboxd.models import SessionState
from sandboxd.snapshot_store import SnapshotStore
from sandboxd.snapshots import AUTO_LABEL, Snapshots
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint"  # the AUTO_LABEL value of a checkpoint


class Checkpoints:
    def __init__(self, snapshots: Snapshots, sessions: SessionStore, store: SnapshotStore) -> None:
        self._snapshots = snapshots
        self._sessions = sessions
        self._store = store

    async def once(self) -> int:
        """A checkpoint of each running session, one at a time; how many were taken."""
        taken = 0
        for session in await self._sessions.all():
            # A disk workspace outlives its sandbox: a dead one is rebuilt on it, whole.
            if session.state is not SessionState.RUNNING or session.spec.on_disk:
                continue
            token = tenancy.current_tenant.set(session.tenant)  # as the session's tenant
            try:
                with disk_full.translated():  # a full disk: this one not taken, the next tried
                    snap = await self._snapshots.create(
                        session.session_id, {AUTO_LABEL: CHECKPOINT}, "", resume=False
                    )
                    for old in await self._store.of_session(session.session_id):
                        if old.labels.get(AUTO_LABEL) == CHECKPOINT and old.snapshot_id != (
                            snap.snapshot_id
                        ):
                            await self._snapshots.delete(old.snapshot_id)
                taken += 1
            except SandboxError as exc:  # refused (unreadable, full) or gone meanwhile
                log.warning("checkpoint of %s not taken: %s", session.session_id, exc)
            finally:
                tenancy.current_tenant.reset(token)
        return taken

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.once()
