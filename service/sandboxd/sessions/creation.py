"""A session made: its request checked, its image allowed and present, its record, sandbox,
manifest and (for a fork) its source's workspace, each step undone if a later one fails.

The record is written before the sandbox exists (state CREATING) so a crash mid-create leaves
something reconcile can find and clean; a create that fails takes back every step it made (an
undo stack), never leaving half a session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from datetime import timedelta

from sandboxd import domain_events, images, tenancy
from sandboxd.commands import SandboxCommands
from sandboxd.config import Config
from sandboxd.engine.protocol import Engine
from sandboxd.errors import AlreadyExists, FailedPrecondition
from sandboxd.host_ids import HostIds
from sandboxd.isolation import IsolationTiers
from sandboxd.models import PullPolicy, Session, SessionState
from sandboxd.pulls import Pulls, Resolved
from sandboxd.reasons import Reason
from sandboxd.session_locks import SessionLocks
from sandboxd.sessions.forks import disk_source, fit_to_source
from sandboxd.sessions.keeper import WorkspaceKeeper
from sandboxd.sessions.manifest import write_manifest
from sandboxd.sessions.quota import QuotaGate
from sandboxd.sessions.recovery import now
from sandboxd.sessions.sandboxes import Sandboxes, Undo
from sandboxd.sessions.spec import CreateSessionInput, check_create
from sandboxd.snapshot_store import Snapshot
from sandboxd.store import SessionStore
from sandboxd.templates.builtin import TemplateImages
from sandboxd.volumes.claims import VolumeClaims, claim_volumes

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Creation:
    """What a create uses of the session manager's parts (sessions/lifecycle.py wires them)."""

    _config: Config
    _engine: Engine
    _commands: SandboxCommands  # the manifest's unpacking
    _store: SessionStore
    _keeper: WorkspaceKeeper
    _locks: SessionLocks
    _quota: QuotaGate
    _sandboxes: Sandboxes
    _host_ids: HostIds
    _allowlist: Callable[[], None] | None  # None: no egress proxies, ALLOWLIST is refused
    _observer: domain_events.Observer
    _tiers: IsolationTiers | None = None
    _pulls: Pulls | None = None
    _templates: TemplateImages | None = None
    _volumes: VolumeClaims | None = None

    def _created(self, session: Session, from_snapshot_id: str) -> None:
        self._observer.emit(
            domain_events.SessionActed(
                session.tenant,
                session.session_id,
                "create",
                image=session.spec.image,
                from_snapshot_id=from_snapshot_id,
            )
        )

    async def create(self, req: CreateSessionInput) -> Session:
        own_templates = (
            await self._templates.ready_images(tenancy.current())
            if self._templates is not None and req.template
            else {}
        )
        checked = check_create(
            req,
            self._config,
            self._allowlist,
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
                    self._created(
                        existing, checked.from_snapshot_id
                    )  # the same create again: its answer
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
            self._created(session, checked.from_snapshot_id)
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
