"""A session's sandbox on the engine: provision it (pool or cold), tear it down (one routine).

`provision` records each step it completes on an `Undo` stack, so a create or rebuild that
fails half-way removes exactly what it made. `teardown` is the one way a session's sandbox
goes: the session-end hooks (background processes), the sandbox, then its egress proxy.
Both keep the tenant's CPU weight in step (tenant_cpu.py): a provisioned sandbox joins its
tenant's share, a removed or lost one leaves it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence

from sandboxd.egress.manager import EgressManager
from sandboxd.engine.protocol import Engine, SandboxRequest
from sandboxd.errors import SandboxError
from sandboxd.models import NetworkMode, Session
from sandboxd.pool import WarmPool
from sandboxd.profile import container_name
from sandboxd.store import SessionStore
from sandboxd.tenant_cpu import TenantCpu

log = logging.getLogger(__name__)

SessionEndHook = Callable[[str], Awaitable[None]]


class Undo:
    """Steps to take back, newest first; each runs even when an earlier one fails."""

    def __init__(self) -> None:
        self._steps: list[Callable[[], Awaitable[object]]] = []

    def push(self, step: Callable[[], Awaitable[object]]) -> None:
        self._steps.append(step)

    async def run(self) -> None:
        while self._steps:
            step = self._steps.pop()
            try:
                await step()
            except SandboxError as exc:
                log.warning("undo of a half-done session step failed: %s", exc)


class Sandboxes:
    def __init__(
        self,
        engine: Engine,
        store: SessionStore,
        owner_id: str,
        *,
        pool: WarmPool | None,
        egress: EgressManager | None,
        on_session_end: Sequence[SessionEndHook],
        cpu: TenantCpu | None = None,  # None: every sandbox the engine's default weight
    ) -> None:
        self._engine = engine
        self._cpu = cpu
        self._store = store
        self._owner_id = owner_id
        self._pool = pool
        self._egress = egress
        self._on_end = list(on_session_end)

    def request(self, session: Session) -> SandboxRequest:
        allowlist = session.spec.network.mode is NetworkMode.ALLOWLIST
        return SandboxRequest(
            spec=session.spec,
            owner_id=self._owner_id,
            name=container_name(self._owner_id, session.session_id),
            session_id=session.session_id,
            fingerprint=session.fingerprint,
            egress_port=self._egress.port if allowlist and self._egress is not None else 0,
        )

    async def provision(
        self,
        session: Session,
        undo: Undo,
        *,
        warm_ok: bool = True,
        start: Callable[[str], Awaitable[None]] | None = None,
        disk_from: str = "",
    ) -> None:
        """A started sandbox for `session`, its id recorded in the store.

        `warm_ok`: a warm container may serve, and its host identity becomes the session's
        (a create). A rebuild passes False: a resumed session keeps the uid its files and its
        record have. `start`: how the created sandbox starts (a memory resume starts it from
        its checkpoint); the engine's plain start by default. `disk_from`: the disk a disk
        workspace is made as a copy of (a fork of a disk snapshot; no warm container)."""
        egress = session.spec.network.mode is NetworkMode.ALLOWLIST and self._egress is not None
        if egress and self._egress is not None:
            undo.push(lambda: self._release_egress(session))
            await self._egress.prepare(session)  # before the start: the agent's HELLO asks
        request = self.request(session)
        pool = self._pool if warm_ok and not disk_from else None
        created_with = 0  # a warm member's: the default, until its tenant's share is set
        warm = await pool.claim(request) if pool is not None else None
        if warm is not None and pool is not None:
            # Started already; carries the pool label, linked by the stored id. The record
            # takes the member's host id before the pool lets go of it.
            session.container_id = warm.container_id
            session.spec = session.spec.as_host(warm.host_id, warm.host_id)
            if warm.disk_id:  # a disk member: its disk, made for its uid, is the session's
                session.spec = dataclasses.replace(session.spec, disk_id=warm.disk_id)
                undo.push(lambda: self._engine.disks.delete(warm.disk_id))
            undo.push(lambda: self._engine.remove_sandbox(warm.container_id))
            try:
                await self._store.update_spec(session)
                await self._store.update(session)
            finally:
                pool.settled(warm.container_id)
            await self._joined(session, created_with, undo)
            return
        await self._ensure_disk(session, undo, disk_from)
        # Pushed first: a create cancelled before the engine answered left it under its name.
        undo.push(lambda: self.remove_by_name(session.session_id))
        if self._cpu is not None:
            created_with = self._cpu.share_for_create(session)
            request = dataclasses.replace(request, cpu_shares=created_with)
        sandbox_id = await self._engine.create_sandbox(request)
        session.container_id = sandbox_id
        undo.push(lambda: self._engine.remove_sandbox(sandbox_id))
        await self._store.update(session)
        await (start or self._engine.start_sandbox)(sandbox_id)
        if egress and self._egress is not None:
            await self._egress.install_trust(session)  # secrets: the session CA
        await self._joined(session, created_with, undo)

    async def _joined(self, session: Session, created_with: int, undo: Undo) -> None:
        if self._cpu is not None:
            # A create that fails after this (its manifest, its restore) removes the sandbox
            # through `undo`, not a teardown: it leaves its tenant's weight the same way.
            undo.push(lambda: self.lost(session))
            await self._cpu.joined(session, created_with)

    async def adopt(self, session: Session) -> None:
        """A running session the reconcile found (after a restart: not yet counted)."""
        if self._cpu is not None:
            await self._cpu.adopt(session)

    async def lost(self, session: Session) -> None:
        """Its sandbox is gone without a teardown: no longer part of its tenant's weight."""
        if self._cpu is not None:
            await self._cpu.left(session)

    async def _ensure_disk(self, session: Session, undo: Undo, disk_from: str = "") -> None:
        """A disk workspace's disk, made (empty, owned by the session's host uid) when it is
        not there: at a create, or a rebuild whose disk the engine lost (the snapshot then
        fills it); or a copy of `disk_from` given to that uid (on the engine host: no byte
        through the server). One this call made goes again with a create or rebuild that
        fails."""
        spec = session.spec
        if not spec.on_disk or await self._engine.disks.exists(spec.disk_id):
            return
        undo.push(lambda: self._engine.disks.delete(spec.disk_id))
        if disk_from:
            await self._engine.disks.copy(disk_from, spec.disk_id, spec.uid, spec.gid)
            return
        await self._engine.disks.create(
            spec.disk_id, spec.limits.workspace_bytes, spec.uid, spec.gid
        )

    async def disk_kept(self, session: Session) -> bool:
        """Whether the session's workspace outlives its sandbox: a disk that is still there."""
        spec = session.spec
        return spec.on_disk and await self._engine.disks.exists(spec.disk_id)

    async def teardown(
        self,
        session: Session,
        *,
        keep_network: bool = False,
        quiet: bool = False,
        drop_disk: bool = False,
    ) -> None:
        """End what runs in the sandbox, remove it, close its egress proxy (unless kept).

        `drop_disk`: the session ends (delete, expiry, a failed or abandoned create), and a
        disk workspace goes with its sandbox; a suspend or a rebuild keeps it. `quiet` logs
        engine failures instead of raising them (a best-effort cleanup).
        """
        try:
            try:
                if session.container_id:
                    await self._engine.remove_sandbox(session.container_id)
                else:
                    await self.remove_by_name(session.session_id)
            finally:
                # Once the sandbox is gone (or its removal failed), not before: a command
                # started before the removal (a StartProcess racing a Delete) is forgotten
                # too, and cannot show up under a new session that reuses the id.
                for hook in self._on_end:
                    await hook(session.session_id)
                await self.lost(session)
        except SandboxError:
            if not quiet:
                raise
            log.warning("could not remove the sandbox of %s", session.session_id, exc_info=True)
        if drop_disk and session.spec.on_disk:
            try:
                await self._engine.disks.delete(session.spec.disk_id)
            except SandboxError:
                if not quiet:
                    raise
                log.warning("could not remove the disk of %s", session.session_id, exc_info=True)
        if keep_network:
            return
        try:
            await self._release_egress(session)
        except SandboxError:
            if not quiet:
                raise

    async def release_network(self, session: Session) -> None:
        """The session's egress proxy goes; the sandbox stays (already lost)."""
        with contextlib.suppress(SandboxError):
            await self._release_egress(session)

    async def _release_egress(self, session: Session) -> None:
        if session.spec.network.mode is NetworkMode.ALLOWLIST and self._egress is not None:
            await self._egress.release(session.session_id)

    async def remove_by_name(self, session_id: str) -> None:
        for found in await self._engine.list_sandboxes(self._owner_id):
            if found.session_id == session_id:
                await self._engine.remove_sandbox(found.sandbox_id)

    async def status(self, session: Session) -> tuple[bool, bool]:
        """(running, conforms): is the sandbox there and still the one the spec asks for?"""
        status = await self._engine.inspect_sandbox(session.container_id, self.request(session))
        if status is None:
            return False, False
        return status.running, status.conforms
