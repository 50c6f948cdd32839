"""Sessions whose sandbox is gone, altered or past its lease: the reaper and reconcile.

Every decision is taken under the session's lock on a fresh read, since these run beside live
calls: a create in progress holds its lock until its record says RUNNING, a renew moves the
lease before the reaper looks again. The reaper asks the store only for the ids that are due
(an indexed query), so an idle server does not decode every stored spec every interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from sandboxd import disk_full
from sandboxd.egress.manager import EgressManager
from sandboxd.engine.protocol import Engine
from sandboxd.errors import FailedPrecondition, SandboxError, SessionNotFound, Unavailable
from sandboxd.models import WORKSPACE_DISK_PREFIX, Loss, Session, SessionState
from sandboxd.pool import WarmPool
from sandboxd.reasons import Reason
from sandboxd.session_locks import SessionLocks
from sandboxd.sessions.keeper import WorkspaceKeeper
from sandboxd.sessions.leftovers import remove_leftovers
from sandboxd.sessions.sandboxes import Sandboxes
from sandboxd.snapshot_store import Snapshot
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)

# How long the record of an ended (EXPIRED or FAILED) session stays after its lease ended.
ENDED_RETENTION = timedelta(hours=1)
# The states whose record keeps its disk workspace.
LIVE_STATES = (SessionState.CREATING, SessionState.RUNNING, SessionState.SUSPENDED)


def now() -> datetime:
    return datetime.now(tz=UTC)


def container_lost(session_id: str, *, retry: bool = False) -> SandboxError:
    """The one error for a vanished container.

    CONTAINER_REBUILDING (UNAVAILABLE, retryable) when the next call rebuilds it from the
    session's snapshot; CONTAINER_LOST (FAILED_PRECONDITION) when nothing can bring it back.
    One code per reason, so a client's retry decision never depends on which path it hit.
    """
    if retry:
        return Unavailable(
            f"the container of session {session_id!r} is gone; it is rebuilt from the "
            "session's last snapshot on the next call: retry",
            reason=Reason.CONTAINER_REBUILDING,
            metadata={"session_id": session_id, "retry": "true"},
        )
    return FailedPrecondition(
        f"the container of session {session_id!r} is gone (removed, altered or the engine "
        "restarted) and it has no snapshot: its workspace cannot be recovered",
        reason=Reason.CONTAINER_LOST,
        metadata={"session_id": session_id},
    )


def lost_now(snap: Snapshot | None) -> Loss:
    """The loss of a sandbox found dead now, restored (later) from `snap`, the best source
    the server holds for its workspace (None: none)."""
    if snap is None:
        return Loss(now())
    return Loss(now(), snap.snapshot_id, snap.created_at)


# Called under the session's lock when its lease ended (sandboxd.leases.ExpiryPolicy):
# True when it handled the session (suspended it) instead of the default expiry.
ExpiryHook = Callable[[Session, Sandboxes], Awaitable[bool]]


def container_busy(session_id: str) -> SandboxError:
    """The engine refused a call on a sandbox that is still there (paused for a commit,
    restarting, or slow): retryable, and the session is not touched."""
    return Unavailable(
        f"the container of session {session_id!r} is busy (paused, committing or restarting); "
        "retry",
        reason=Reason.UNAVAILABLE,
        metadata={"session_id": session_id, "retry": "true"},
    )


class Recovery:
    def __init__(
        self,
        engine: Engine,
        store: SessionStore,
        locks: SessionLocks,
        sandboxes: Sandboxes,
        keeper: WorkspaceKeeper,
        owner_id: str,
        *,
        pool: WarmPool | None = None,
        egress: EgressManager | None = None,
        on_expiry: ExpiryHook | None = None,
    ) -> None:
        self._on_expiry = on_expiry
        self._engine = engine
        self._store = store
        self._locks = locks
        self._sandboxes = sandboxes
        self._keeper = keeper
        self._owner_id = owner_id
        self._pool = pool
        self._egress = egress
        self._due = asyncio.Event()  # set by a read that saw an ended lease
        # The first reconcile runs before this server serves a call: what an operation of a
        # server that died left in a workspace (an import's staging folder) is removed then.
        self._started = now()
        self._tidied = False
        self._leftovers_cleared = False  # an older or dead server's networks, stand-ins
        self._reaped = False  # loops of removed disk images: detached once, at start

    # ----- lost sandboxes -----------------------------------------------------------------

    async def mark_lost(self, session: Session) -> None:
        """Under the session's lock: a RUNNING session whose sandbox is gone becomes
        SUSPENDED when a snapshot can rebuild it, FAILED when nothing can; either way its
        record says what was lost (`Session.loss`)."""
        if session.state is not SessionState.RUNNING:
            return
        snap = await self._keeper.latest(session.session_id)
        on_disk = await self._sandboxes.disk_kept(session)
        has_snapshot = snap is not None or on_disk
        session.loss = Loss.on_disk(now()) if on_disk else lost_now(snap)
        session.state = SessionState.SUSPENDED if has_snapshot else SessionState.FAILED
        session.container_id = "" if has_snapshot else session.container_id
        await self._store.update(session)
        await self._sandboxes.lost(session)
        await self._sandboxes.release_network(session)
        log.warning("container lost", extra={"session_id": session.session_id})

    async def container_lost(self, session: Session) -> SandboxError:
        """An engine call on the sandbox failed as if it were gone; the error to report.

        Busy is not lost: a paused, committing or restarting container, or an exec that
        vanished, answers like a missing one (404/409). So the session is marked lost only
        after a check that cannot race: under its lock, the record still names the same
        sandbox, and the engine, asked afresh, says it is gone or stopped. Otherwise the
        caller gets a retryable UNAVAILABLE and the session stays as it is. An engine that
        does not answer the check raises (EngineUnavailable): nothing is marked either.
        """
        async with self._locks.locked(session.session_id):
            current = await self._store.get(session.session_id)
            if current is None or current.created_at != session.created_at:
                return SessionNotFound(session.session_id)  # deleted meanwhile
            if (
                current.state is SessionState.RUNNING
                and current.container_id == session.container_id
            ):
                running, _ = await self._sandboxes.status(current)
                if running:
                    return container_busy(session.session_id)
                await self.mark_lost(current)
            elif current.state is SessionState.RUNNING:
                return container_busy(session.session_id)  # rebuilt meanwhile: try again
            retry = current.state is SessionState.SUSPENDED
        return container_lost(session.session_id, retry=retry)

    async def raced(self, session: Session) -> SandboxError | None:
        """After an engine failure of a call on `session`: the answer if the call raced a
        Delete (SESSION_NOT_FOUND), or a Suspend or rebuild that took its sandbox away
        (retryable UNAVAILABLE): as if it had come after them. None: it raced nothing, the
        failure stands."""
        async with self._locks.locked(session.session_id):
            current = await self._store.get(session.session_id)
        if current is None or current.created_at != session.created_at:
            return SessionNotFound(session.session_id)
        if current.state is not SessionState.RUNNING or current.container_id != (
            session.container_id
        ):
            return container_busy(session.session_id)
        return None

    async def _tidy(self, session: Session) -> None:
        try:
            await self._keeper.tidy(session)
        except SandboxError as exc:
            log.warning("could not tidy the workspace of %s: %s", session.session_id, exc)

    # ----- leases -------------------------------------------------------------------------

    async def expire(self, session: Session) -> None:
        """Under the session's lock: remove the sandbox of an ended lease, keep the record."""
        if self._on_expiry is not None and await self._on_expiry(session, self._sandboxes):
            return
        await self._sandboxes.teardown(session, drop_disk=True)
        session.state = SessionState.EXPIRED
        session.container_id = ""
        await self._store.update(session)
        log.info("lease expired", extra={"session_id": session.session_id})

    async def reap_once(self) -> int:
        """Expire every lease that ended; prune ended records past retention.
        Returns how many leases expired."""
        at = now()
        count = 0
        for session_id in await self._store.due_for_expiry(at):
            async with self._locks.locked(session_id):
                current = await self._store.get(session_id)
                if current is None or current.state is SessionState.EXPIRED:
                    continue
                if current.lease_expires_at > at:
                    continue  # renewed meanwhile
                await self.expire(current)
                count += 1
        for session_id in await self._store.ended_before(at - ENDED_RETENTION):
            async with self._locks.locked(session_id):
                current = await self._store.get(session_id)
                if current is None or current.state not in (
                    SessionState.EXPIRED,
                    SessionState.FAILED,
                ):
                    continue
                if current.lease_expires_at + ENDED_RETENTION > at:
                    continue
                if current.state is SessionState.FAILED:
                    await self._sandboxes.teardown(current, quiet=True, drop_disk=True)
                await self._store.delete(session_id)
                await self._keeper.forget_session(session_id)
        return count

    def wake(self) -> None:
        """Run the reaper now rather than at its next interval."""
        self._due.set()

    async def run_reaper(self, interval_s: float) -> None:
        while True:
            self._due.clear()
            try:
                with disk_full.translated():
                    await self.reap_once()
            except SandboxError as exc:
                log.warning("lease reaper: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._due.wait(), interval_s)

    # ----- reconcile ----------------------------------------------------------------------

    async def reconcile(self) -> int:
        """When the engine comes up (and every sweep): note lost sandboxes, remove ours that
        no record claims, finish creates that died with a previous server, remove what an
        older or dead server left (until none is left); how many leftover networks went."""
        sandboxes = await self._engine.list_sandboxes(self._owner_id)
        # Pool members carry no session label. Snapshot what the pool holds *before* reading
        # the records: a claim leaves the pool only once its record names it.
        pool = self._pool
        held = {
            s.sandbox_id for s in sandboxes if pool is not None and pool.owns(s.sandbox_id, s.name)
        }
        rows = await self._store.index()
        by_sandbox = {row.container_id: row.session_id for row in rows if row.container_id}
        # What the index already shows claimed (a RUNNING record naming the container) needs
        # no locked read: each sweep then costs the engine and the store a few calls, not a
        # few per live session. Only what the index leaves in doubt is read again, locked.
        claimed_ids = {
            row.container_id
            for row in rows
            if row.state is SessionState.RUNNING and row.container_id
        }
        listed_running = {s.sandbox_id for s in sandboxes if s.running}
        for found in sandboxes:
            if found.sandbox_id in held or found.sandbox_id in claimed_ids:
                continue  # a live pool member (the pool removes its own), or claimed
            sid = found.session_id or by_sandbox.get(found.sandbox_id, "")
            async with self._locks.locked(sid):
                record = await self._store.get(sid) if sid else None
                claimed = (
                    record is not None
                    and record.state is SessionState.RUNNING
                    and record.container_id == found.sandbox_id
                )
                if not claimed:
                    log.info("removing orphan container %s", found.sandbox_id[:12])
                    await self._engine.remove_sandbox(found.sandbox_id)
        await self._sweep_disks()
        removed_networks = 0
        if not self._leftovers_cleared:  # after the orphans that may have held a network
            leftovers = await remove_leftovers(self._engine, self._owner_id)
            self._leftovers_cleared = leftovers.done
            removed_networks = leftovers.networks
        if self._egress is not None:  # proxies first: tidying opens the agents' channels
            await self._reconcile_egress()
        for row in rows:
            if row.state not in (SessionState.CREATING, SessionState.RUNNING):
                continue
            if (
                self._tidied
                and row.state is SessionState.RUNNING
                and row.container_id in listed_running
            ):
                # Running in the listing: nothing to note, and (once the first reconcile has
                # tidied what an older server left) nothing to tidy. An inspect per live
                # session per sweep was O(live) engine calls every minute.
                continue
            async with self._locks.locked(row.session_id):
                current = await self._store.get(row.session_id)
                if current is None:
                    continue
                if current.state is SessionState.CREATING:
                    # A create that died with a previous server: take it all back.
                    await self._sandboxes.teardown(current, quiet=True, drop_disk=True)
                    await self._store.delete(current.session_id)
                elif current.state is SessionState.RUNNING:
                    running, _ = await self._sandboxes.status(current)
                    if not running:
                        await self.mark_lost(current)
                        continue
                    await self._sandboxes.adopt(current)
                    if not self._tidied and current.created_at < self._started:
                        await self._tidy(current)
        self._tidied = True
        if self._egress is not None:  # and the proxies of sessions found lost go
            await self._reconcile_egress()
        return removed_networks

    async def _sweep_disks(self) -> None:
        """Remove the workspace disks no live record names (a delete or expiry whose removal
        failed, a create that died with a server, a dead server's pool member never used);
        nothing else: not a live session's, not a warm member's, not a named volume's (another
        id prefix). The disks are listed before the records are
        read: a create writes its record before it makes its disk."""
        disks = [
            d for d in await self._engine.disks.list_ids() if d.startswith(WORKSPACE_DISK_PREFIX)
        ]
        if disks:
            await self._remove_disks(disks)
        if not self._reaped:
            await self._reap_loops()

    async def _reap_loops(self) -> None:
        """The loops an image volume removed while attached left (by hand, by a cleanup that
        removed engine volumes past the API, of any server): the kernel keeps their blocks
        until they are detached (storage/disks.py, `reap`). An engine host without the disk
        tool has none to reap; another failure: the next sweep tries again."""
        try:
            reaped = await self._engine.disks.reap()
        except FailedPrecondition as exc:
            log.info("no loop devices to reap: %s", exc)
        except SandboxError as exc:
            log.warning("could not reap the loops of removed disks: %s", exc)
            return
        else:
            for device in reaped:
                log.warning("detached %s: its disk image was removed while attached", device)
        self._reaped = True

    async def _remove_disks(self, disks: list[str]) -> None:
        # The pool's first (a claim leaves it once its record names the disk), then records.
        pooled = self._pool.disks() if self._pool is not None else set()
        kept = await self._store.disk_ids(LIVE_STATES) | pooled
        for disk_id in disks:
            if disk_id in kept:
                continue
            log.info("removing the disk %s no session holds", disk_id)
            try:
                await self._engine.disks.delete(disk_id)
            except SandboxError as exc:  # still mounted: the next sweep
                log.warning("could not remove the disk %s: %s", disk_id, exc)

    async def _reconcile_egress(self) -> None:
        if self._egress is not None:
            # Only the records that ask for a proxy (and, in the manager, those that hold
            # one): the others need no locked read of their record at each sweep.
            ids = await self._store.allowlist_ids()
            await self._egress.reconcile(self._store.get, self._locks.locked, ids)
