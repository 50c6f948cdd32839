"""Session lifecycle: create, get, list, renew, delete, suspend, resume.

A session is one hardened sandbox plus a record in the store. Making one is sessions/creation.py,
suspending and resuming it sessions/suspension.py, its network policy sessions/network.py; each
change a caller made emits a `SessionActed` (its audit record, committed before the call
answers). Reads (`get`, `list_sessions`) have no side effects on records or sandboxes: a lease
that ended is expired by the reaper, under the session's lock (a read that sees one only wakes
the reaper), and no operation uses such a session meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta

from sandboxd import domain_events, paging, tenancy, validation
from sandboxd.commands import SandboxCommands
from sandboxd.config import Config
from sandboxd.egress.audit import EgressEvent
from sandboxd.egress.manager import EgressManager
from sandboxd.engine.protocol import Engine
from sandboxd.errors import (
    FailedPrecondition,
    Internal,
    NotFound,
    SandboxError,
    SessionNotFound,
)
from sandboxd.host_ids import HostIds
from sandboxd.isolation import IsolationTiers
from sandboxd.models import NetworkPolicy, Session, SessionState, SuspendMode
from sandboxd.pool import WarmPool
from sandboxd.pulls import Pulls
from sandboxd.reasons import Reason
from sandboxd.session_locks import SessionLocks
from sandboxd.sessions.creation import Creation
from sandboxd.sessions.gate import WorkspaceGate
from sandboxd.sessions.keeper import WorkspaceKeeper
from sandboxd.sessions.liveness import lease_ended, require_live
from sandboxd.sessions.memory_suspension import MemoryOptions, MemorySuspension
from sandboxd.sessions.network import SessionNetwork
from sandboxd.sessions.quota import QuotaGate
from sandboxd.sessions.recovery import ExpiryHook, Recovery, now
from sandboxd.sessions.sandboxes import Sandboxes, SessionEndHook
from sandboxd.sessions.spec import CreateSessionInput, check_lease
from sandboxd.sessions.suspension import Suspension
from sandboxd.store import SessionStore
from sandboxd.templates.builtin import TemplateImages
from sandboxd.tenant_cpu import TenantCpu
from sandboxd.volumes.claims import VolumeClaims
from sandboxd.volumes.disk_quota import DiskQuota

log = logging.getLogger(__name__)


class SessionManager:
    def __init__(
        self,
        config: Config,
        engine: Engine,
        store: SessionStore,
        owner_id: str,
        keeper: WorkspaceKeeper,
        *,
        pool: WarmPool | None = None,
        egress: EgressManager | None = None,
        on_session_end: Sequence[SessionEndHook] = (),
        on_expiry: ExpiryHook | None = None,
        tiers: IsolationTiers | None = None,
        pulls: Pulls | None = None,
        templates: TemplateImages | None = None,
        host_ids: HostIds | None = None,
        volumes: VolumeClaims | None = None,
        memory: MemoryOptions | None = None,  # None: no memory suspend
        commands: SandboxCommands,
        disk_quota: DiskQuota | None = None,  # None: no tenant_max_disk_bytes
        observer: domain_events.Observer = domain_events.SILENT,  # a caller's changes
    ) -> None:
        self._observer = observer
        self._config = config
        self._engine = engine
        self._commands = commands  # the manifest's unpacking (sessions/creation.py)
        self._store = store
        self._keeper = keeper
        self.owner_id = owner_id
        self._locks = SessionLocks()
        self._gate = WorkspaceGate()
        # What lives in a sandbox beyond one call (background processes) ends with it.
        # Each tenant's sandboxes one CPU weight together (tenant_cpu.py).
        self.cpu = (
            TenantCpu(
                engine,
                demotion=config.admission.cpu_demotion,
                demoted_cpu_millis=config.admission.demoted_cpu_millis,
            )
            if config.admission.tenant_cpu
            else None
        )
        self._sandboxes = Sandboxes(
            engine,
            store,
            owner_id,
            pool=pool,
            egress=egress,
            on_session_end=on_session_end,
            cpu=self.cpu,
        )
        self._recovery = Recovery(
            engine,
            store,
            self._locks,
            self._sandboxes,
            keeper,
            owner_id,
            pool=pool,
            egress=egress,
            on_expiry=on_expiry,
        )
        self._suspension = Suspension(
            get=self.get,
            store=store,
            locks=self._locks,
            gate=self._gate,
            keeper=keeper,
            sandboxes=self._sandboxes,
            recovery=self._recovery,
            pulls=pulls,
            memory=MemorySuspension(
                engine, store, keeper, self._sandboxes, memory or MemoryOptions()
            ),
        )
        self._network = SessionNetwork(
            store,
            self._locks,
            egress,
            get=self.get,
            require_running=self.require_running,
            observer=observer,
        )
        self._creation = Creation(
            config,
            engine,
            commands,
            store,
            keeper,
            self._locks,
            QuotaGate(config, store, disk_quota),
            self._sandboxes,
            # Shared with the warm pool, whose containers hold ids too (server/parts.py).
            host_ids or HostIds.for_config(config, store),
            self._network.allowlist_check(),
            observer,
            _tiers=tiers,  # None: runc only
            _pulls=pulls,  # None: images are never pulled (absent is IMAGE_NOT_FOUND)
            _templates=templates,  # None: the built-in templates only
            _volumes=volumes,  # None: a create naming a volume is VOLUME_NOT_FOUND
        )
        # Commands (Exec, Run, ...) hold one of these per tenant while they run.
        self.exec_slots = tenancy.ExecSlots(config.tenancy.max_concurrent_execs)

    # ----- background work and lost sandboxes (sandboxd.sessions.recovery) ----------------

    async def reap_once(self) -> int:
        """Expire the leases that ended, prune ended records; how many expired."""
        return await self._recovery.reap_once()

    async def reconcile(self) -> int:
        """How many leftover networks it removed (Sweep reports them)."""
        return await self._recovery.reconcile()

    async def run_reaper(self, interval_s: float) -> None:
        await self._recovery.run_reaper(interval_s)

    async def container_lost(self, session: Session) -> SandboxError:
        return await self._recovery.container_lost(session)

    def locked(self, session_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """The session's lock: every change of its record or sandbox is made under it."""
        return self._locks.locked(session_id)

    # ----- create (sessions/creation.py) --------------------------------------------------

    async def create(self, req: CreateSessionInput) -> Session:
        return await self._creation.create(req)

    def _acted(self, session: Session, action: str) -> None:
        self._observer.emit(
            domain_events.SessionActed(
                session.tenant,
                session.session_id,
                action,
                image=session.spec.image if action == "create" else "",
            )
        )

    # ----- reads (no side effects) ------------------------------------------------------

    async def get(self, session_id: str) -> Session:
        validation.validate_session_id(session_id)
        session = await self._store.get(session_id)
        if session is None or session.tenant != tenancy.current():
            # Another tenant's session answers exactly like a missing one.
            raise SessionNotFound(session_id)
        self._note_lease(session)
        return session

    async def list_sessions(
        self,
        label_selector: Mapping[str, str],
        page_size: int,
        page_token: str,
        state: SessionState | None = None,
    ) -> tuple[list[Session], str]:
        size = paging.page_size(page_size)
        selector = validation.validate_labels(label_selector)
        bound = f"sessions {sorted(selector.items())!r} {state} {tenancy.current()!r}"
        after = paging.decode_token(page_token, _is_session_id, bound)
        sessions = await self._store.page(
            after=after,
            limit=size + 1,
            labels=selector,
            tenant=tenancy.current(),
            state=state.value if state is not None else None,
        )
        token = ""
        if len(sessions) > size:
            sessions = sessions[:size]
            token = paging.encode_token(sessions[-1].session_id, bound)
        for s in sessions:
            self._note_lease(s)
        return sessions, token

    def _note_lease(self, session: Session) -> None:
        if lease_ended(session):
            self._recovery.wake()

    async def require_running(self, session_id: str, *, resume: bool = True) -> Session:
        """The session, if commands and file operations may use it now; a SUSPENDED one is
        resumed, unless `resume` is False (the server's own work: never a session's wake-up)."""
        session = await self.get(session_id)
        require_live(session)
        if session.state is SessionState.SUSPENDED:
            if not resume:
                raise FailedPrecondition(
                    f"session {session_id!r} is suspended",
                    reason=Reason.SESSION_NOT_RUNNING,
                    metadata={"session_id": session_id},
                )
            # Rebuilt from its snapshot, lazily: part of the call that uses it, not a Resume.
            return await self._suspension.resume(session_id, None)
        return session

    @contextlib.asynccontextmanager
    async def use(
        self, session_id: str, *, exclusive: bool = False, gate: bool = True, resume: bool = True
    ) -> AsyncIterator[Session]:
        """A running session for the duration of one operation.

        Holds the session's workspace gate (sessions/gate.py): shared for file calls and
        imports, `exclusive` for a snapshot. An engine that says the sandbox is gone or
        stopped marks the session lost (after a check, recovery.py); an engine failure of
        a call that raced a Delete, Suspend or rebuild is answered as if the call had come
        after it. The gate is let go before either check, which takes the session's lock.
        """
        session = await self.require_running(session_id, resume=resume)
        failure: SandboxError | None = None
        hold = (
            (self._gate.exclusive if exclusive else self._gate.shared)(session_id)
            if gate
            else contextlib.nullcontext()
        )
        async with hold:
            try:
                yield session
            except (NotFound, FailedPrecondition) as exc:
                if exc.reason not in (Reason.ENGINE_OBJECT_NOT_FOUND, Reason.ENGINE_CONFLICT):
                    raise
                failure = exc
            except Internal as exc:
                failure = exc
        if isinstance(failure, Internal):
            raise await self._recovery.raced(session) or failure
        if failure is not None:
            raise await self.container_lost(session) from failure

    @contextlib.asynccontextmanager
    async def use_for_command(self, session_id: str) -> AsyncIterator[Session]:
        """`use`, holding one of the tenant's exec slots: a running command counts against
        tenant_max_concurrent_execs until it ends. Commands do not hold the workspace gate
        (they may run for minutes; a Suspend ends them)."""
        async with self.use(session_id, gate=False) as session, self.exec_slots.slot():
            yield session

    async def is_current(self, session: Session) -> bool:
        """Under the session's lock: is this still the live record (not deleted, not a new
        session under the same id)?"""
        current = await self._store.get(session.session_id)
        return current is not None and current.created_at == session.created_at

    # ----- changes ----------------------------------------------------------------------

    async def renew(self, session_id: str, ttl_s: float | None) -> Session:
        lease_s = check_lease(ttl_s, "ttl", self._config)
        async with self._locks.locked(session_id):
            session = await self.get(session_id)
            if session.state is SessionState.EXPIRED or lease_ended(session):
                raise FailedPrecondition(
                    f"the lease of session {session_id!r} already expired",
                    reason=Reason.LEASE_EXPIRED,
                    metadata={"session_id": session_id},
                )
            session.lease_expires_at = now() + timedelta(seconds=lease_s)
            await self._store.update(session)
            self._acted(session, "renew")
            return session

    async def delete(self, session_id: str) -> bool:
        """Whether this call removed the session (deleting is idempotent)."""
        validation.validate_session_id(session_id)
        async with self._locks.locked(session_id):
            session = await self._store.get(session_id)
            if session is None or session.tenant != tenancy.current():
                # Idempotent; another tenant's session is not there for the caller.
                self._observer.emit(
                    domain_events.SessionActed(
                        tenancy.current(), session_id, "delete", existed=False
                    )
                )
                return False
            await self._sandboxes.teardown(session, drop_disk=True)
            await self._store.delete(session_id)
            await self._keeper.forget_session(session_id)
            log.info("session deleted", extra={"session_id": session_id})
            self._acted(session, "delete")
            return True

    async def suspend(self, session_id: str, mode: SuspendMode = SuspendMode.FILESYSTEM) -> Session:
        """Snapshot the workspace (and with MEMORY its processes and memory), then remove the
        sandbox; lease and snapshot stay."""
        session = await self._suspension.suspend(session_id, mode)
        self._acted(session, "suspend")
        return session

    async def memory_suspend_unsupported(self) -> str:
        """Empty when gVisor sessions can be suspended with their memory; else why not."""
        return await self._suspension.memory.why_not()

    async def resume(self, session_id: str, expected_fingerprint: str | None) -> Session:
        """Running again, rebuilt from the last snapshot where the sandbox is gone."""
        session = await self._suspension.resume(session_id, expected_fingerprint)
        self._acted(session, "resume")
        return session

    async def update_network_policy(self, session_id: str, asked: NetworkPolicy) -> Session:
        """A live session's new allowlist (sessions/network.py)."""
        return await self._network.update(session_id, asked)

    async def egress_events(
        self, session_id: str, page_size: int, page_token: str
    ) -> tuple[list[EgressEvent], str]:
        """A page of the session's egress audit, oldest first (sessions/network.py)."""
        return await self._network.egress_events(session_id, page_size, page_token)


def _is_session_id(value: str) -> bool:
    try:
        validation.validate_session_id(value)
    except SandboxError:
        return False
    return True
