"""Session lifecycle: create, get, list, renew, delete, suspend, resume.

A session is one hardened sandbox plus a record in the store. The record is written before the
sandbox exists (state CREATING) so a crash mid-create leaves something reconcile can find and
clean; a create that fails takes back every step it made (an undo stack), never leaving half a
session. Reads (`get`, `list_sessions`) have no side effects on records or sandboxes: a lease
that ended is expired by the reaper, under the session's lock (a read that sees one only wakes
the reaper), and no operation uses such a session meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta

from sandboxd import images, paging, tenancy, validation
from sandboxd.commands import SandboxCommands
from sandboxd.config import Config
from sandboxd.egress.audit import EgressEvent
from sandboxd.egress.manager import EgressManager
from sandboxd.engine.protocol import Engine
from sandboxd.errors import (
    AlreadyExists,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    SandboxError,
    SessionNotFound,
)
from sandboxd.host_ids import HostIds
from sandboxd.isolation import IsolationTiers
from sandboxd.models import NetworkPolicy, PullPolicy, Session, SessionState, SuspendMode
from sandboxd.pool import WarmPool
from sandboxd.pulls import Pulls, Resolved
from sandboxd.reasons import Reason
from sandboxd.secrets.bindings import settle_secrets
from sandboxd.sessions.forks import disk_source, fit_to_source
from sandboxd.sessions.gate import WorkspaceGate
from sandboxd.sessions.keeper import WorkspaceKeeper
from sandboxd.sessions.liveness import lease_ended, require_live
from sandboxd.sessions.locks import SessionLocks
from sandboxd.sessions.manifest import write_manifest
from sandboxd.sessions.memory_suspension import MemoryOptions, MemorySuspension
from sandboxd.sessions.quota import QuotaGate
from sandboxd.sessions.recovery import ExpiryHook, Recovery, now
from sandboxd.sessions.sandboxes import Sandboxes, SessionEndHook, Undo
from sandboxd.sessions.spec import CreateSessionInput, check_create, check_lease, check_network
from sandboxd.sessions.suspension import Suspension
from sandboxd.snapshot_store import Snapshot
from sandboxd.store import SessionStore
from sandboxd.templates.builtin import TemplateImages
from sandboxd.volumes.claims import VolumeClaims, claim_volumes
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
    ) -> None:
        self._config = config
        self._commands = commands  # the manifest's unpacking
        self._volumes = volumes  # None: a create naming a volume is VOLUME_NOT_FOUND
        # Shared with the warm pool, whose containers hold ids too (server/parts.py).
        self._host_ids = host_ids or HostIds.for_config(config, store)
        self._templates = templates  # None: the built-in templates only
        self._tiers = tiers  # None: runc only
        self._pulls = pulls  # None: images are never pulled (absent is IMAGE_NOT_FOUND)
        self._engine = engine
        self._store = store
        self._keeper = keeper
        self._egress = egress  # None: ALLOWLIST sessions are refused (NETWORK_MODE_UNSUPPORTED)
        self.owner_id = owner_id
        self._locks = SessionLocks()
        self._gate = WorkspaceGate()
        self._quota = QuotaGate(config, store, disk_quota)
        # What lives in a sandbox beyond one call (background processes) ends with it.
        self._sandboxes = Sandboxes(
            engine, store, owner_id, pool=pool, egress=egress, on_session_end=on_session_end
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

    def _allowlist(self) -> None:
        if self._egress is None:
            raise InvalidArgument(
                "network.mode ALLOWLIST is not available on this server; use DENY",
                reason=Reason.NETWORK_MODE_UNSUPPORTED,
            )
        self._egress.require_available()

    # ----- create -----------------------------------------------------------------------

    async def create(self, req: CreateSessionInput) -> Session:
        own_templates = (
            await self._templates.ready_images(tenancy.current())
            if self._templates is not None and req.template
            else {}
        )
        checked = check_create(
            req,
            self._config,
            self._allowlist if self._egress else None,
            self._tiers,
            own_templates=own_templates,
        )
        session_id, spec = checked.session_id, checked.spec
        fingerprint = spec.fingerprint()
        async with self._locks.locked(session_id):
            existing = await self._store.get(session_id)
            if existing is not None:
                same = existing.tenant == tenancy.current() and existing.fingerprint == fingerprint
                if same and existing.state in (SessionState.RUNNING, SessionState.CREATING):
                    return existing
                # A record of another tenant can only be from before authentication (ids are
                # partitioned by tenant since): refuse without saying whose it is.
                metadata = {"session_id": session_id}
                if existing.tenant == tenancy.current():
                    metadata["fingerprint"] = existing.fingerprint
                raise AlreadyExists(
                    f"session {session_id!r} already exists with a different manifest "
                    "fingerprint (or has ended)",
                    reason=Reason.SESSION_ALREADY_EXISTS,
                    metadata=metadata,
                )
            source = await self._fork_source(checked.from_snapshot_id)
            spec = fit_to_source(spec, req, source)  # a disk snapshot forks into a disk
            # The allowlist first: an image outside it is refused before the engine is asked,
            # so a caller cannot probe which images exist.
            images.check_image(
                spec.image,
                images.allowed_patterns(
                    self._config.images.allowlist,
                    tenancy.current_grants().image_allowlist,
                    default_image=self._config.engine.image,
                ),
                own_images=[
                    *await self._keeper.images_of(tenancy.current()),
                    *own_templates.values(),
                ],
            )
            if self._templates is not None:  # a built-in still being built is not pulled
                await self._templates.require_ready(spec.image)
            resolved = await self._resolve_image(spec.image, checked.pull_policy, source)
            if source is not None and resolved is not None:  # a fork runs its source's image
                spec = dataclasses.replace(
                    spec, image_digest=resolved.digest, image_id=resolved.image_id
                )
            if not await self._engine.image_exists(spec.image):
                raise FailedPrecondition(
                    f"image {spec.image!r} is not present on the engine (images are not pulled)",
                    reason=Reason.IMAGE_NOT_FOUND,
                    metadata={"image": spec.image},
                )
            created = now()
            # The session's own host uid and gid, whatever `user` asked: held until the
            # record that takes it is written (a fork gets its own; a warm container brings
            # the one it was made with, sessions/sandboxes.py).
            async with (
                self._host_ids.holding() as host_id,
                claim_volumes(self._volumes, spec.volumes, host_id) as mounts,
            ):
                session = Session(
                    session_id=session_id,
                    spec=dataclasses.replace(spec.as_host(host_id, host_id), volumes=mounts),
                    fingerprint=fingerprint,
                    state=SessionState.CREATING,
                    created_at=created,
                    lease_expires_at=created + timedelta(seconds=checked.lease_s),
                    labels=checked.labels,
                    tenant=tenancy.current(),
                )
                await self._quota.insert(session)
            undo = Undo()
            undo.push(lambda: self._store.delete(session_id))
            try:
                # A warm container has another host uid than the one the volumes were handed to.
                await self._sandboxes.provision(
                    session, undo, warm_ok=not mounts, disk_from=disk_source(source)
                )
                if spec.manifest.files or spec.manifest.directories:
                    await write_manifest(self._commands, session)
                if source is not None:
                    await self._keeper.restore(session, source)
                    undo.push(lambda: self._keeper.forget_session(session_id))
                    await self._keeper.adopt(source, session)
                if resolved is not None:
                    await self._record_image(session, resolved)
                session.state = SessionState.RUNNING
                await self._store.update(session)
            except BaseException:
                await asyncio.shield(undo.run())
                raise
            log.info("session created", extra={"session_id": session_id})
            return session

    async def _resolve_image(
        self, image: str, policy: PullPolicy, source: Snapshot | None
    ) -> Resolved | None:
        """The image on the engine, pulled under `policy` (sandboxd.pulls); a fork runs the
        digest its source session ran."""
        if self._pulls is None:
            return None
        like = await self._store.get(source.session_id) if source is not None else None
        return await self._pulls.for_session(image, policy, like=like.spec if like else None)

    async def _record_image(self, session: Session, resolved: Resolved) -> None:
        """After provision (the warm pool matches the unpinned shape): the digest it runs."""
        if session.spec.image_id != resolved.image_id:
            session.spec = dataclasses.replace(
                session.spec, image_digest=resolved.digest, image_id=resolved.image_id
            )
            await self._store.update_spec(session)
        if self._pulls is not None:
            await self._pulls.note_use(resolved.image_id)

    async def _fork_source(self, snapshot_id: str) -> Snapshot | None:
        """The snapshot a fork starts from (NOT_FOUND before anything is created)."""
        return await self._keeper.lookup(snapshot_id) if snapshot_id else None

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
            return await self.resume(session_id, None)  # rebuilt from its snapshot, lazily
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
            return session

    async def delete(self, session_id: str) -> bool:
        """Whether this call removed the session (deleting is idempotent)."""
        validation.validate_session_id(session_id)
        async with self._locks.locked(session_id):
            session = await self._store.get(session_id)
            if session is None or session.tenant != tenancy.current():
                return False  # idempotent; another tenant's session is not there for the caller
            await self._sandboxes.teardown(session, drop_disk=True)
            await self._store.delete(session_id)
            await self._keeper.forget_session(session_id)
            log.info("session deleted", extra={"session_id": session_id})
            return True

    async def suspend(self, session_id: str, mode: SuspendMode = SuspendMode.FILESYSTEM) -> Session:
        """Snapshot the workspace (and with MEMORY its processes and memory), then remove the
        sandbox; lease and snapshot stay."""
        return await self._suspension.suspend(session_id, mode)

    async def memory_suspend_unsupported(self) -> str:
        """Empty when gVisor sessions can be suspended with their memory; else why not."""
        return await self._suspension.memory.why_not()

    async def resume(self, session_id: str, expected_fingerprint: str | None) -> Session:
        """Running again, rebuilt from the last snapshot where the sandbox is gone."""
        return await self._suspension.resume(session_id, expected_fingerprint)

    async def update_network_policy(self, session_id: str, asked: NetworkPolicy) -> Session:
        """A live session's new allowlist: new proxy connections follow it, open tunnels stay."""
        network = check_network(asked, self._allowlist if self._egress else None, live=True)
        async with self._locks.locked(session_id):
            session = await self.require_running(session_id)
            if session.spec.network.mode is not network.mode:
                raise FailedPrecondition(
                    f"network.mode of session {session_id!r} is "
                    f"{session.spec.network.mode.value} and cannot change on a live session",
                    reason=Reason.NETWORK_MODE_FIXED,
                    metadata={"session_id": session_id},
                )
            network = settle_secrets(network, session.spec.network)
            session.spec = dataclasses.replace(session.spec, network=network)
            session.fingerprint = session.spec.fingerprint()
            await self._store.update_spec(session)
            if self._egress is not None:
                self._egress.update(session_id, network)
            log.info("network policy updated", extra={"session_id": session_id})
            return session

    async def egress_events(
        self, session_id: str, page_size: int, page_token: str
    ) -> tuple[list[EgressEvent], str]:
        """A page of the session's egress audit, oldest first; the token is the last seq."""
        await self.get(session_id)  # NOT_FOUND for unknown and other tenants' sessions
        size = paging.page_size(page_size)
        bound = f"egress {session_id}"
        after = int(paging.decode_token(page_token, str.isdigit, bound) or 0)
        audit = self._egress.audit(session_id) if self._egress is not None else None
        events = audit.events(after_seq=after, limit=size + 1) if audit is not None else []
        token = ""
        if len(events) > size:
            events = events[:size]
            token = paging.encode_token(str(events[-1].seq), bound)
        return events, token


def _is_session_id(value: str) -> bool:
    try:
        validation.validate_session_id(value)
    except SandboxError:
        return False
    return True
