"""Session lifecycle: create, get, list, renew, delete, and the lease reaper.

A session is one hardened container plus a record in the store. The record is written
before the container exists (state CREATING) so a crash mid-create leaves something the
reaper can find and clean; a create that fails removes both, never leaving half a session.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import logging
import secrets
import tarfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sandboxd import tenancy, validation
from sandboxd.config import Config
from sandboxd.egress.audit import EgressEvent
from sandboxd.egress.networks import EgressManager, apply_to_container
from sandboxd.egress.policy import validate_policy
from sandboxd.engine import Engine
from sandboxd.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SandboxError,
    SessionNotFound,
    Unavailable,
)
from sandboxd.models import (
    LIMIT_NAMES,
    Limits,
    LimitsRequest,
    ManifestFile,
    NetworkMode,
    NetworkPolicy,
    Session,
    SessionSpec,
    SessionState,
    ShellPolicy,
    WorkspaceManifest,
)
from sandboxd.pool import WarmPool
from sandboxd.profile import LABEL_OWNER, container_config, container_name
from sandboxd.snapshot_store import Snapshot
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)

MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100
MAX_MANIFEST_ENTRIES = 10_000
MAX_ALLOW_ENTRIES = 256
EXPIRED_RETENTION = timedelta(hours=1)
# States that count against a tenant's session and memory quotas.
_QUOTA_STATES = tuple(
    s.value for s in SessionState if s not in (SessionState.EXPIRED, SessionState.FAILED)
)


@dataclass(frozen=True)
class CreateSessionInput:
    """A create request as the servicer decoded it; not yet validated."""

    session_id: str = ""
    image: str = ""
    limits: LimitsRequest = field(default_factory=LimitsRequest)
    shell: ShellPolicy = field(default_factory=ShellPolicy)
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    lease_ttl_s: float | None = None
    user: str = ""
    manifest: WorkspaceManifest = field(default_factory=WorkspaceManifest)
    from_snapshot_id: str = ""


class WorkspaceKeeper(Protocol):
    """What sessions need of snapshots (sandboxd.snapshots.Snapshots), without importing it."""

    async def take(self, session: Session, labels: Mapping[str, str]) -> Snapshot: ...
    async def latest(self, session_id: str) -> Snapshot | None: ...
    async def restore(self, session: Session, snap: Snapshot) -> None: ...
    async def lookup(self, snapshot_id: str) -> Snapshot: ...
    async def adopt(self, snap: Snapshot, session: Session) -> Snapshot: ...
    async def forget_session(self, session_id: str) -> None: ...


def resolve_limits(requested: LimitsRequest, defaults: Limits, maxima: Limits) -> Limits:
    """Fill unset limits from the defaults; refuse any above the server's maximum."""
    values = {}
    for name in LIMIT_NAMES:
        asked = getattr(requested, name)
        if asked is None:
            values[name] = getattr(defaults, name)
            continue
        if asked <= 0:
            raise InvalidArgument(
                f"limits.{_proto_limit_name(name)} must be positive (got {asked})",
                reason="LIMIT_INVALID",
                metadata={"limit": _proto_limit_name(name)},
            )
        maximum = getattr(maxima, name)
        if asked > maximum:
            raise InvalidArgument(
                f"limits.{_proto_limit_name(name)} = {asked} is above the server maximum {maximum}",
                reason="LIMIT_EXCEEDS_MAXIMUM",
                metadata={"limit": _proto_limit_name(name), "maximum": str(maximum)},
            )
        values[name] = asked
    limits = Limits(**values)
    if limits.memory_bytes < 6 * 1024 * 1024:
        raise InvalidArgument(
            "limits.memory_bytes must be at least 6 MiB (a Docker minimum)",
            reason="LIMIT_INVALID",
            metadata={"limit": "memory_bytes"},
        )
    if limits.cpu_millis < 10:
        raise InvalidArgument(
            "limits.cpu_millis must be at least 10 (the kernel's smallest CPU quota is 1 ms)",
            reason="LIMIT_INVALID",
            metadata={"limit": "cpu_millis"},
        )
    return limits


def _proto_limit_name(name: str) -> str:
    return "command_timeout" if name == "command_timeout_s" else name


def _now() -> datetime:
    return datetime.now(tz=UTC)


def build_manifest_tar(manifest: WorkspaceManifest) -> bytes:
    """A tar of the declared directories and files; paths were validated already."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        wanted = list(manifest.directories) + [
            str(p) for f in manifest.files for p in _parents(f.path)
        ]
        for d in wanted:
            for p in [*_parents(d), d]:
                if p not in dirs and p != ".":
                    dirs.add(p)
                    info = tarfile.TarInfo(p)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
        for f in manifest.files:
            info = tarfile.TarInfo(f.path)
            info.size = len(f.content)
            info.mode = f.mode
            tar.addfile(info, io.BytesIO(f.content))
    return buf.getvalue()


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


class SessionManager:
    def __init__(
        self,
        config: Config,
        engine: Engine,
        store: SessionStore,
        owner_id: str,
        *,
        pool: WarmPool | None = None,
        egress: EgressManager | None = None,
    ) -> None:
        self._pool = pool
        self._egress = egress  # None: ALLOWLIST sessions are refused (NETWORK_MODE_UNSUPPORTED)
        self._config = config
        self._engine = engine
        self._store = store
        self.owner_id = owner_id
        self._locks: dict[str, asyncio.Lock] = {}
        # Set by sandboxd.snapshots: suspend, resume, fork and rebuilding lost containers.
        self.snapshots: WorkspaceKeeper | None = None
        # Called with the session id before its container goes (delete, lease end): what lives
        # in the container beyond one call (background processes) is ended and forgotten.
        self.on_session_end: list[Callable[[str], Awaitable[None]]] = []
        self._quotas = tenancy.TenantQuotas(
            max_sessions=config.tenant_max_sessions,
            max_memory_bytes=config.tenant_max_memory_bytes,
        )
        self._tenant_locks: dict[str, asyncio.Lock] = {}
        # Commands (Exec, Run, ...) hold one of these per tenant while they run.
        self.exec_slots = tenancy.ExecSlots(config.tenant_max_concurrent_execs)

    # ----- validation -------------------------------------------------------------------

    def _validate(self, req: CreateSessionInput) -> tuple[str, SessionSpec, float]:
        if req.session_id:
            session_id = validation.validate_session_id(req.session_id)
            tenancy.check_session_id(session_id)
        else:
            session_id = tenancy.generated_session_id(secrets.token_hex(8))
        limits = resolve_limits(req.limits, self._config.default_limits, self._config.max_limits)
        uid, gid = validation.parse_user(req.user)
        env = validation.validate_env(req.env)
        network = self._validate_network(req.network)
        if len(req.shell.allow) > MAX_ALLOW_ENTRIES:
            raise InvalidArgument(
                f"shell.allow has more than {MAX_ALLOW_ENTRIES} entries", reason="INVALID_SHELL"
            )
        for name in req.shell.allow:
            if not name or "/" in name or "\0" in name or len(name) > 255:
                raise InvalidArgument(
                    f"shell.allow entry {name!r} must be a bare command name",
                    reason="INVALID_SHELL",
                )
        manifest = self._validate_manifest(req.manifest, limits)
        image = validation.validate_image(req.image or self._config.image)
        lease = self._lease(req.lease_ttl_s, "lease_ttl")
        spec = SessionSpec(
            image=image,
            limits=limits,
            shell=ShellPolicy(
                allow=tuple(sorted(set(req.shell.allow))), allow_all=req.shell.allow_all
            ),
            network=network,
            env=env,
            uid=uid,
            gid=gid,
            manifest=manifest,
        )
        return session_id, spec, lease

    def _validate_network(self, asked: NetworkPolicy) -> NetworkPolicy:
        network = validate_policy(asked)
        if network.mode is NetworkMode.ALLOWLIST:
            if self._egress is None:
                raise InvalidArgument(
                    "network.mode ALLOWLIST is not available on this server; use DENY",
                    reason="NETWORK_MODE_UNSUPPORTED",
                )
            self._egress.require_available()
        return network

    async def _with_egress(self, request: dict[str, Any], session: Session) -> dict[str, Any]:
        """The container request of an ALLOWLIST session: on its network, with its proxy.

        Also the hook for anything that re-creates a session's container (resume).
        """
        if session.spec.network.mode is not NetworkMode.ALLOWLIST or self._egress is None:
            return request
        return apply_to_container(request, await self._egress.prepare(session))

    async def _release_egress(self, session: Session) -> None:
        if session.spec.network.mode is NetworkMode.ALLOWLIST and self._egress is not None:
            await self._egress.release(session.session_id)

    def _validate_manifest(self, manifest: WorkspaceManifest, limits: Limits) -> WorkspaceManifest:
        if len(manifest.files) + len(manifest.directories) > MAX_MANIFEST_ENTRIES:
            raise InvalidArgument(
                f"workspace manifest has more than {MAX_MANIFEST_ENTRIES} entries",
                reason="MANIFEST_TOO_LARGE",
            )
        if len(manifest.id) > 256:
            raise InvalidArgument(
                "workspace.id is longer than 256 characters", reason="INVALID_MANIFEST"
            )
        files: list[ManifestFile] = []
        seen: set[str] = set()
        for f in manifest.files:
            rel = validation.workspace_relpath(f.path, allow_root=False)
            if rel in seen:
                raise InvalidArgument(
                    f"workspace file {rel!r} is declared twice", reason="INVALID_MANIFEST"
                )
            seen.add(rel)
            if len(f.content) > limits.file_bytes:
                raise ResourceExhausted(
                    f"workspace file {rel!r} is {len(f.content)} bytes, over the file cap of "
                    f"{limits.file_bytes}",
                    reason="FILE_TOO_LARGE",
                    metadata={"path": rel, "limit": str(limits.file_bytes)},
                )
            files.append(
                ManifestFile(rel, f.content, validation.validate_file_mode(f.mode, default=0o644))
            )
        dirs = tuple(
            validation.workspace_relpath(d, allow_root=False) for d in manifest.directories
        )
        for rel in seen:
            if (
                rel in dirs
                or any(d.startswith(rel + "/") for d in dirs)
                or any(o.startswith(rel + "/") for o in seen)
            ):
                raise InvalidArgument(
                    f"workspace path {rel!r} is declared as a file and used as a directory",
                    reason="INVALID_MANIFEST",
                )
        result = WorkspaceManifest(id=manifest.id, files=tuple(files), directories=dirs)
        if result.total_bytes() > limits.workspace_bytes:
            raise ResourceExhausted(
                f"workspace manifest holds {result.total_bytes()} bytes, over the workspace cap "
                f"of {limits.workspace_bytes}",
                reason="WORKSPACE_FULL",
            )
        return result

    def _lease(self, ttl_s: float | None, field_name: str) -> float:
        if ttl_s is None:
            return self._config.lease_default_s
        if ttl_s <= 0:
            raise InvalidArgument(f"{field_name} must be positive", reason="LEASE_INVALID")
        if ttl_s > self._config.lease_max_s:
            raise InvalidArgument(
                f"{field_name} of {ttl_s:g} s is above the server maximum of "
                f"{self._config.lease_max_s:g} s",
                reason="LIMIT_EXCEEDS_MAXIMUM",
                metadata={"limit": field_name, "maximum": f"{self._config.lease_max_s:g}s"},
            )
        return ttl_s

    # ----- lifecycle --------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _locked(self, session_id: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and not lock._waiters:  # no one else wants it: forget it
                self._locks.pop(session_id, None)

    async def create(self, req: CreateSessionInput) -> Session:
        session_id, spec, lease_s = self._validate(req)
        labels = validation.validate_labels(req.labels)
        fingerprint = spec.fingerprint()
        async with self._locked(session_id):
            existing = await self._store.get(session_id)
            if existing is not None and existing.tenant != tenancy.current():
                # Only a record from before authentication can be here (ids are partitioned
                # by tenant since): refuse without saying whose it is or what it holds.
                raise AlreadyExists(
                    f"session {session_id!r} already exists with a different manifest "
                    "fingerprint (or has ended)",
                    reason="SESSION_ALREADY_EXISTS",
                    metadata={"session_id": session_id},
                )
            if existing is not None:
                if existing.fingerprint == fingerprint and existing.state in (
                    SessionState.RUNNING,
                    SessionState.CREATING,
                ):
                    return existing
                raise AlreadyExists(
                    f"session {session_id!r} already exists with a different manifest "
                    "fingerprint (or has ended)",
                    reason="SESSION_ALREADY_EXISTS",
                    metadata={"session_id": session_id, "fingerprint": existing.fingerprint},
                )
            source = await self._fork_source(req.from_snapshot_id)
            if not await self._engine.image_exists(spec.image):
                raise FailedPrecondition(
                    f"image {spec.image!r} is not present on the engine (images are not pulled)",
                    reason="IMAGE_NOT_FOUND",
                    metadata={"image": spec.image},
                )
            now = _now()
            session = Session(
                session_id=session_id,
                spec=spec,
                fingerprint=fingerprint,
                state=SessionState.CREATING,
                created_at=now,
                lease_expires_at=now + timedelta(seconds=lease_s),
                labels=labels,
                tenant=tenancy.current(),
            )
            await self._insert_within_quota(session)
            try:
                request = container_config(
                    spec=spec,
                    session_id=session_id,
                    owner_id=self.owner_id,
                    fingerprint=fingerprint,
                    helper_path=self._config.helper,
                    keeper_user=self._config.keeper_user,
                )
                request = await self._with_egress(request, session)
                warm = await self._pool.claim(request) if self._pool is not None else None
                if warm is not None and self._pool is not None:
                    # Started already; carries the pool label, linked by the stored id.
                    session.container_id = warm
                    try:
                        await self._store.update(session)
                    finally:
                        self._pool.settled(warm)
                else:
                    session.container_id = await self._engine.create_container(
                        request, name=container_name(self.owner_id, session_id)
                    )
                    await self._store.update(session)
                    await self._engine.start_container(session.container_id)
                if spec.manifest.files or spec.manifest.directories:
                    await self._populate(session)
                if source is not None and self.snapshots is not None:
                    await self.snapshots.restore(session, source)
                    await self.snapshots.adopt(source, session)
                session.state = SessionState.RUNNING
                await self._store.update(session)
            except BaseException:
                await asyncio.shield(self._discard(session))
                raise
            log.info("session created", extra={"session_id": session_id})
            return session

    async def _insert_within_quota(self, session: Session) -> None:
        """Check the tenant's quotas and record the session, with no other create between."""
        lock = self._tenant_locks.setdefault(session.tenant, asyncio.Lock())
        async with lock:
            count, memory = await self._store.tenant_usage(session.tenant, _QUOTA_STATES)
            self._quotas.check_create(count, memory, session.spec.limits.memory_bytes)
            await self._store.insert(session)

    async def _populate(self, session: Session) -> None:
        archive = await asyncio.to_thread(build_manifest_tar, session.spec.manifest)
        async with self._engine.exec(
            session.container_id,
            ["tar", "-x", "-f", "-", "-C", "/workspace"],
            user=session.spec.user,
            stdin=True,
        ) as stream:
            await stream.write(archive)
            stream.close_stdin()
            errors = bytearray()
            while (chunk := await stream.read()) is not None:
                errors += chunk[1][: 4096 - len(errors)]
            code = await stream.wait_exit_code()
        if code != 0:
            text = errors.decode(errors="replace").strip()
            if "space" in text.lower():
                raise ResourceExhausted(
                    "the workspace manifest does not fit in the workspace", reason="WORKSPACE_FULL"
                )
            raise FailedPrecondition(
                f"could not write the workspace manifest (tar exited {code}: {text})",
                reason="MANIFEST_WRITE_FAILED",
            )

    async def _discard(self, session: Session) -> None:
        with contextlib.suppress(SandboxError):
            if session.container_id:
                await self._engine.remove_container(session.container_id)
            else:
                await self._remove_by_name(session.session_id)
            await self._release_egress(session)
        await self._store.delete(session.session_id)

    async def _remove_by_name(self, session_id: str) -> None:
        for c in await self._engine.list_containers({LABEL_OWNER: self.owner_id}):
            if c.get("Labels", {}).get("io.sandboxd.session") == session_id:
                await self._engine.remove_container(str(c["Id"]))

    async def get(self, session_id: str) -> Session:
        validation.validate_session_id(session_id)
        session = await self._store.get(session_id)
        if session is None or session.tenant != tenancy.current():
            # Another tenant's session answers exactly like a missing one.
            raise SessionNotFound(session_id)
        if session.state is not SessionState.EXPIRED and session.lease_expires_at <= _now():
            await self._expire(session)
        return session

    async def require_running(self, session_id: str) -> Session:
        """The session, if commands and file operations may use it now."""
        session = await self.get(session_id)
        self._require_live(session)
        if session.state is SessionState.SUSPENDED:
            return await self.resume(session_id, None)  # rebuilt from its snapshot, lazily
        return session

    @contextlib.asynccontextmanager
    async def use(self, session_id: str) -> AsyncIterator[Session]:
        """A running session for the duration of one operation.

        An engine that says the container is gone or stopped marks the session FAILED.
        """
        session = await self.require_running(session_id)
        try:
            yield session
        except (NotFound, FailedPrecondition) as exc:
            if exc.reason in ("ENGINE_OBJECT_NOT_FOUND", "ENGINE_CONFLICT"):
                raise await self.container_lost(session) from exc
            raise

    @contextlib.asynccontextmanager
    async def use_for_command(self, session_id: str) -> AsyncIterator[Session]:
        """`use`, holding one of the tenant's exec slots: a running command counts against
        tenant_max_concurrent_execs until it ends."""
        async with self.use(session_id) as session, self.exec_slots.slot():
            yield session

    async def container_lost(self, session: Session) -> SandboxError:
        """Record that the engine no longer has the container; the error to report."""
        async with self._locked(session.session_id):
            current = await self._store.get(session.session_id)
            if current is not None:
                await self._mark_lost(current)
            if current is not None and current.state is SessionState.SUSPENDED:
                return Unavailable(
                    f"the container of session {session.session_id!r} is gone; it is rebuilt "
                    "from the session's last snapshot on the next call: retry",
                    reason="CONTAINER_LOST",
                    metadata={"session_id": session.session_id, "retry": "true"},
                )
        return _container_lost(session.session_id)

    async def _mark_lost(self, session: Session) -> None:
        if session.state is SessionState.RUNNING:
            # With a snapshot the session is only suspended: resume rebuilds it from there.
            has_snapshot = (
                self.snapshots is not None
                and await self.snapshots.latest(session.session_id) is not None
            )
            session.state = SessionState.SUSPENDED if has_snapshot else SessionState.FAILED
            session.container_id = "" if has_snapshot else session.container_id
            await self._store.update(session)
            with contextlib.suppress(SandboxError):
                await self._release_egress(session)
            log.warning("container lost", extra={"session_id": session.session_id})

    async def list_sessions(
        self, label_selector: Mapping[str, str], page_size: int, page_token: str
    ) -> tuple[list[Session], str]:
        if page_size < 0:
            raise InvalidArgument("page_size must not be negative", reason="INVALID_PAGE_SIZE")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        after = _decode_token(page_token)
        selector = validation.validate_labels(label_selector)
        sessions = await self._store.page(
            after=after, limit=size + 1, labels=selector, tenant=tenancy.current()
        )
        now = _now()
        for s in sessions:
            if s.state is not SessionState.EXPIRED and s.lease_expires_at <= now:
                await self._expire(s)
        token = ""
        if len(sessions) > size:
            sessions = sessions[:size]
            token = base64.urlsafe_b64encode(sessions[-1].session_id.encode()).decode()
        return sessions, token

    async def renew(self, session_id: str, ttl_s: float | None) -> Session:
        lease_s = self._lease(ttl_s, "ttl")
        async with self._locked(session_id):
            session = await self.get(session_id)
            if session.state is SessionState.EXPIRED:
                raise FailedPrecondition(
                    f"the lease of session {session_id!r} already expired",
                    reason="LEASE_EXPIRED",
                    metadata={"session_id": session_id},
                )
            session.lease_expires_at = _now() + timedelta(seconds=lease_s)
            await self._store.update(session)
            return session

    # ----- suspend, resume, fork (workspace kept by sandboxd.snapshots) ------------------

    def _keeper(self) -> WorkspaceKeeper:
        if self.snapshots is None:  # pragma: no cover - server.py always attaches one
            raise FailedPrecondition("snapshots are not available", reason="SESSION_NOT_RUNNING")
        return self.snapshots

    async def _fork_source(self, snapshot_id: str) -> Snapshot | None:
        """The snapshot a fork starts from (NOT_FOUND before anything is created)."""
        return await self._keeper().lookup(snapshot_id) if snapshot_id else None

    async def suspend(self, session_id: str) -> Session:
        """Snapshot the workspace, then remove the container; lease and snapshot stay."""
        async with self._locked(session_id):
            session = await self.get(session_id)
            if session.state is SessionState.SUSPENDED:
                return session
            self._require_live(session)
            await self._keeper().take(session, {"io.sandboxd.auto": "suspend"})
            for hook in self.on_session_end:
                await hook(session_id)
            await self._engine.remove_container(session.container_id)
            with contextlib.suppress(SandboxError):
                await self._release_egress(session)
            session.state = SessionState.SUSPENDED
            session.container_id = ""
            await self._store.update(session)
            log.info("session suspended", extra={"session_id": session_id})
            return session

    async def resume(self, session_id: str, expected_fingerprint: str | None) -> Session:
        """Running again: a removed, lost or tampered-with container is rebuilt from the last
        snapshot. An expired lease is refused, never answered with an empty workspace."""
        async with self._locked(session_id):
            session = await self.get(session_id)
            if expected_fingerprint is not None and expected_fingerprint != session.fingerprint:
                raise FailedPrecondition(
                    f"session {session_id!r} has fingerprint {session.fingerprint}, not the "
                    "expected one",
                    reason="MANIFEST_CONFLICT",
                    metadata={"session_id": session_id, "fingerprint": session.fingerprint},
                )
            self._require_live(session)
            if session.state is SessionState.RUNNING:
                info = await self._engine.inspect_container(session.container_id)
                running = info is not None and bool(info.get("State", {}).get("Running"))
                mismatch = running and info is not None and self._tampered(session, info)
                if running and not mismatch:
                    return session
                if mismatch:
                    log.warning(
                        "container limits changed behind our back; not reused",
                        extra={"session_id": session_id},
                    )
            snap = await self._keeper().latest(session_id)
            if snap is None:
                await self._mark_lost(session)
                raise FailedPrecondition(
                    f"the container of session {session_id!r} is gone (or was altered) and the "
                    "session has no snapshot to rebuild it from",
                    reason="CONTAINER_LOST",
                    metadata={"session_id": session_id},
                )
            await self._rebuild(session, snap)
            return session

    def _require_live(self, session: Session) -> None:
        """Refuse a session that can no longer run: RUNNING and SUSPENDED pass."""
        if session.state is SessionState.EXPIRED:
            raise FailedPrecondition(
                f"the lease of session {session.session_id!r} expired; its container was removed",
                reason="LEASE_EXPIRED",
                metadata={"session_id": session.session_id},
            )
        if session.state is SessionState.FAILED:
            # Only a lost container fails a session: say so on every later call too, not
            # just on the one that found out (reconcile may have been the one).
            raise _container_lost(session.session_id)
        if session.state is SessionState.CREATING:
            raise FailedPrecondition(
                f"session {session.session_id!r} is still being created",
                reason="SESSION_NOT_RUNNING",
                metadata={"session_id": session.session_id, "state": session.state.value},
            )

    def _tampered(self, session: Session, info: Mapping[str, Any]) -> bool:
        """True when the container's limits or security settings are not the session's."""
        want = self._container_request(session)["HostConfig"]
        have = info.get("HostConfig") or {}
        keys = ("Memory", "MemorySwap", "NanoCpus", "PidsLimit", "ReadonlyRootfs", "Privileged")
        if any(have.get(k) != want.get(k) for k in keys):
            return True
        return bool(have.get("CapAdd")) or "no-new-privileges:true" not in (
            have.get("SecurityOpt") or []
        )

    def _container_request(self, session: Session) -> dict[str, Any]:
        return container_config(
            spec=session.spec,
            session_id=session.session_id,
            owner_id=self.owner_id,
            fingerprint=session.fingerprint,
            helper_path=self._config.helper,
            keeper_user=self._config.keeper_user,
        )

    async def _rebuild(self, session: Session, snap: Snapshot) -> None:
        """A new container for an existing record, its workspace restored from `snap`."""
        for hook in self.on_session_end:
            await hook(session.session_id)
        if session.container_id:
            await self._engine.remove_container(session.container_id)
        await self._remove_by_name(session.session_id)  # a stopped one keeps the name
        session.state = SessionState.SUSPENDED
        session.container_id = ""
        await self._store.update(session)
        request = await self._with_egress(self._container_request(session), session)
        try:
            session.container_id = await self._engine.create_container(
                request, name=container_name(self.owner_id, session.session_id)
            )
            await self._store.update(session)
            await self._engine.start_container(session.container_id)
            await self._keeper().restore(session, snap)
            session.state = SessionState.RUNNING
            await self._store.update(session)
        except BaseException:
            await asyncio.shield(self._undo_rebuild(session))
            raise
        log.info(
            "session resumed from snapshot %s",
            snap.snapshot_id,
            extra={"session_id": session.session_id},
        )

    async def _undo_rebuild(self, session: Session) -> None:
        with contextlib.suppress(SandboxError):
            if session.container_id:
                await self._engine.remove_container(session.container_id)
            await self._release_egress(session)
        session.state = SessionState.SUSPENDED
        session.container_id = ""
        await self._store.update(session)

    async def delete(self, session_id: str) -> None:
        validation.validate_session_id(session_id)
        async with self._locked(session_id):
            session = await self._store.get(session_id)
            if session is None or session.tenant != tenancy.current():
                return  # idempotent, and another tenant's session is not there for this caller
            for hook in self.on_session_end:
                await hook(session_id)
            if session.container_id:
                await self._engine.remove_container(session.container_id)
            else:
                await self._remove_by_name(session_id)
            await self._release_egress(session)
            await self._store.delete(session_id)
            if self.snapshots is not None:
                await self.snapshots.forget_session(session_id)
            log.info("session deleted", extra={"session_id": session_id})

    async def update_network_policy(self, session_id: str, asked: NetworkPolicy) -> Session:
        """A live session's new allowlist: new proxy connections follow it, open tunnels stay."""
        network = self._validate_network(asked)
        async with self._locked(session_id):
            session = await self.require_running(session_id)
            if session.spec.network.mode is not network.mode:
                raise FailedPrecondition(
                    f"network.mode of session {session_id!r} is "
                    f"{session.spec.network.mode.value} and cannot change on a live session",
                    reason="NETWORK_MODE_FIXED",
                    metadata={"session_id": session_id},
                )
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
        if page_size < 0:
            raise InvalidArgument("page_size must not be negative", reason="INVALID_PAGE_SIZE")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        try:
            after = int(page_token) if page_token else 0
        except ValueError:
            raise InvalidArgument(
                "page_token is not one this server issued", reason="INVALID_PAGE_TOKEN"
            ) from None
        audit = self._egress.audit(session_id) if self._egress is not None else None
        events = audit.events(after_seq=after, limit=size + 1) if audit is not None else []
        token = ""
        if len(events) > size:
            events = events[:size]
            token = str(events[-1].seq)
        return events, token

    async def _expire(self, session: Session) -> None:
        """Remove the container of a session whose lease ended; keep the record a while."""
        for hook in self.on_session_end:
            await hook(session.session_id)
        if session.container_id:
            await self._engine.remove_container(session.container_id)
        await self._release_egress(session)
        session.state = SessionState.EXPIRED
        session.container_id = ""
        await self._store.update(session)
        log.info("lease expired", extra={"session_id": session.session_id})

    # ----- background -------------------------------------------------------------------

    async def reap_once(self) -> int:
        """Expire every lease that ended; forget long-expired records. Returns how many expired."""
        now = _now()
        count = 0
        for session in await self._store.expired(now):
            async with self._locked(session.session_id):
                current = await self._store.get(session.session_id)
                if current is None or current.state is SessionState.EXPIRED:
                    continue
                if current.lease_expires_at > now:
                    continue  # renewed meanwhile
                await self._expire(current)
                count += 1
        for session in await self._store.all():
            if (
                session.state is SessionState.EXPIRED
                and session.lease_expires_at + EXPIRED_RETENTION <= now
            ):
                await self._store.delete(session.session_id)
                if self.snapshots is not None:
                    await self.snapshots.forget_session(session.session_id)
        return count

    async def reconcile(self) -> None:
        """When the engine comes up: note lost containers, remove ours that no record claims.

        Runs beside live calls, so every decision is taken under the session's lock and on a
        fresh read: a create in progress holds its lock until its record says RUNNING.
        """
        containers = await self._engine.list_containers({LABEL_OWNER: self.owner_id})
        # Pool containers carry no session label. Snapshot what the pool holds *before*
        # reading the records: a claim leaves the pool only once its record names it.
        pool = self._pool
        held = {
            str(c["Id"])
            for c in containers
            if pool is not None and pool.owns(str(c["Id"]), *(c.get("Names") or [""])[:1])
        }
        by_container = {s.container_id: s.session_id for s in await self._store.all()}
        for c in containers:
            if str(c["Id"]) in held:
                continue  # a live pool member: the pool removes its own
            sid = str(c.get("Labels", {}).get("io.sandboxd.session", "")) or by_container.get(
                str(c["Id"]), ""
            )
            async with self._locked(sid):
                record = await self._store.get(sid) if sid else None
                claimed = (
                    record is not None
                    and record.state is SessionState.RUNNING
                    and record.container_id == c["Id"]
                )
                if not claimed:
                    log.info("removing orphan container %s", str(c["Id"])[:12])
                    await self._engine.remove_container(str(c["Id"]))
        for s in await self._store.all():
            async with self._locked(s.session_id):
                current = await self._store.get(s.session_id)
                if current is None:
                    continue
                if current.state is SessionState.CREATING:
                    await self._discard(current)  # a create that died with a previous server
                elif current.state is SessionState.RUNNING:
                    info = await self._engine.inspect_container(current.container_id)
                    if info is None or not info.get("State", {}).get("Running"):
                        await self._mark_lost(current)
        if self._egress is not None:
            ids = [s.session_id for s in await self._store.all()]
            await self._egress.reconcile(self._store.get, self._locked, ids)

    async def run_reaper(self, interval_s: float) -> None:
        while True:
            try:
                await self.reap_once()
            except SandboxError as exc:
                log.warning("lease reaper: %s", exc)
            await asyncio.sleep(interval_s)


def _container_lost(session_id: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"the container of session {session_id!r} is gone (removed or the engine restarted) "
        "and it has no snapshot: its workspace cannot be recovered",
        reason="CONTAINER_LOST",
        metadata={"session_id": session_id},
    )


def _decode_token(token: str) -> str:
    if not token:
        return ""
    try:
        value = base64.urlsafe_b64decode(token.encode()).decode()
        return validation.validate_session_id(value)
    except (ValueError, UnicodeDecodeError, InvalidArgument):
        raise InvalidArgument(
            "page_token is not one this server issued", reason="INVALID_PAGE_TOKEN"
        ) from None
