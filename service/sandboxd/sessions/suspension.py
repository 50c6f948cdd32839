"""Suspend and resume: a session's workspace carried across the removal of its sandbox.

Suspend snapshots the workspace and removes the sandbox, keeping the record, lease and
snapshot; resume (or the first call on a suspended or lost sandbox) builds a new sandbox of the
same spec, the same image digest, and restores the last snapshot into it. Both run under the
session's lock, and suspend holds the workspace gate so no file call is half-way through.
A rebuild that fails takes back its steps and leaves the session SUSPENDED, never half-made.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime

from sandboxd.errors import FailedPrecondition
from sandboxd.labels import LABEL_AUTO
from sandboxd.models import RESTORED_FROM_DISK, Loss, Session, SessionState, SuspendMode
from sandboxd.pulls import Pulls
from sandboxd.reasons import Reason
from sandboxd.session_locks import SessionLocks
from sandboxd.sessions.forks import disk_source
from sandboxd.sessions.gate import WorkspaceGate
from sandboxd.sessions.keeper import WorkspaceKeeper
from sandboxd.sessions.liveness import require_live
from sandboxd.sessions.memory_suspension import MemorySuspension
from sandboxd.sessions.recovery import Recovery, container_lost, lost_now
from sandboxd.sessions.sandboxes import Sandboxes, Undo
from sandboxd.snapshot_store import Snapshot
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)


class Suspension:
    def __init__(
        self,
        *,
        get: Callable[[str], Awaitable[Session]],
        store: SessionStore,
        locks: SessionLocks,
        gate: WorkspaceGate,
        keeper: WorkspaceKeeper,
        sandboxes: Sandboxes,
        recovery: Recovery,
        pulls: Pulls | None,
        memory: MemorySuspension,
    ) -> None:
        self._get = get
        self._store = store
        self._locks = locks
        self._gate = gate
        self._keeper = keeper
        self._sandboxes = sandboxes
        self._recovery = recovery
        self._pulls = pulls
        self.memory = memory

    async def suspend(self, session_id: str, mode: SuspendMode = SuspendMode.FILESYSTEM) -> Session:
        """Snapshot the workspace, then remove the sandbox; lease and snapshot stay. With
        MEMORY, its processes and memory are checkpointed too (memory_suspension.py)."""
        async with self._locks.locked(session_id):
            session = await self._get(session_id)
            if session.state is SessionState.SUSPENDED:
                return session
            require_live(session)
            if mode is SuspendMode.MEMORY:
                async with self._gate.exclusive(session_id):
                    return await self.memory.suspend(session)
            async with self._gate.exclusive(session_id):  # no file call half-way through
                # A disk workspace stays where it is (no tar of it), unmounted with its sandbox.
                if not session.spec.on_disk:
                    await self._keeper.take(session, {LABEL_AUTO: "suspend"})
                await self._sandboxes.teardown(session, quiet=False, keep_network=True)
            await self._sandboxes.release_network(session)
            session.state = SessionState.SUSPENDED
            session.suspend_mode = SuspendMode.FILESYSTEM
            session.container_id = ""
            await self._store.update(session)
            log.info("session suspended", extra={"session_id": session_id})
            return session

    async def resume(self, session_id: str, expected_fingerprint: str | None) -> Session:
        """Running again: a removed, lost or tampered-with sandbox is rebuilt from the last
        snapshot. An expired lease is refused, never answered with an empty workspace."""
        async with self._locks.locked(session_id):
            session = await self._get(session_id)
            if expected_fingerprint is not None and expected_fingerprint != session.fingerprint:
                raise FailedPrecondition(
                    f"session {session_id!r} has fingerprint {session.fingerprint}, not the "
                    "expected one",
                    reason=Reason.MANIFEST_CONFLICT,
                    metadata={"session_id": session_id, "fingerprint": session.fingerprint},
                )
            require_live(session)
            if session.state is SessionState.RUNNING:
                running, conforms = await self._sandboxes.status(session)
                if running and conforms:
                    return session
                if running:
                    log.warning(
                        "container limits changed behind our back; not reused",
                        extra={"session_id": session_id},
                    )
            checkpoint = await self.memory.checkpoint_of(session)
            if session.state is SessionState.SUSPENDED and checkpoint is not None:
                if self._pulls is not None and session.spec.image_id:
                    await self._pulls.pinned(session.spec)
                return await self.memory.resume(session, checkpoint)
            # A disk workspace that is still there is the best source: every file as it was.
            on_disk = await self._sandboxes.disk_kept(session)
            snap = None if on_disk else await self._keeper.latest(session_id)
            if snap is None and not on_disk:
                await self._recovery.mark_lost(session)
                raise container_lost(session_id)
            if session.state is SessionState.RUNNING:  # its sandbox is gone or not its own
                session.loss = Loss.on_disk(datetime.now(tz=UTC)) if on_disk else lost_now(snap)
            await self._rebuild(session, snap)
            return session

    async def _rebuild(self, session: Session, snap: Snapshot | None) -> None:
        """A new sandbox for an existing record, its workspace restored from `snap`, or
        (None) mounted again from its disk."""
        await self._sandboxes.teardown(session, keep_network=True)
        session.state = SessionState.SUSPENDED
        session.container_id = ""
        await self._store.update(session)
        undo = Undo()
        loss = session.loss
        try:
            if self._pulls is not None and session.spec.image_id:
                await self._pulls.pinned(session.spec)  # the digest it ran, never the tag's
            await self._sandboxes.provision(
                session, undo, warm_ok=False, disk_from=disk_source(snap)
            )
            if snap is not None:
                await self._keeper.restore(session, snap)
            if session.loss is not None and session.loss.restored_at is None:
                # A rebuild after a death: the record says from what, and how old it is.
                session.loss = replace(
                    session.loss,
                    snapshot_id=snap.snapshot_id if snap else RESTORED_FROM_DISK,
                    snapshot_at=snap.created_at if snap else session.loss.lost_at,
                    restored_at=datetime.now(tz=UTC),
                )
            session.state = SessionState.RUNNING
            session.suspend_mode = SuspendMode.NONE
            await self._store.update(session)
        except BaseException:
            session.loss = loss  # not restored after all
            await asyncio.shield(self._undo_rebuild(session, undo))
            raise
        log.info(
            "session resumed from %s",
            f"snapshot {snap.snapshot_id}" if snap else "its disk",
            extra={"session_id": session.session_id},
        )

    async def _undo_rebuild(self, session: Session, undo: Undo) -> None:
        await undo.run()
        session.state = SessionState.SUSPENDED
        session.container_id = ""
        await self._store.update(session)
