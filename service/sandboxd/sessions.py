"""Session lifecycle: create, get, list, renew, delete, and the lease reaper.

A session is one hardened container plus a record in the store. The record is written
before the container exists (state CREATING) so a crash mid-create leaves something the
reaper can find and clean; a create that fails removes both, never leaving half a session.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import logging
import secrets
import tarfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sandboxd import validation
from sandboxd.config import Config
from sandboxd.engine import Engine
from sandboxd.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SandboxError,
    SessionNotFound,
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
from sandboxd.profile import LABEL_OWNER, container_config, container_name
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)

MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100
MAX_MANIFEST_ENTRIES = 10_000
MAX_ALLOW_ENTRIES = 256
EXPIRED_RETENTION = timedelta(hours=1)


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
    def __init__(self, config: Config, engine: Engine, store: SessionStore, owner_id: str) -> None:
        self._config = config
        self._engine = engine
        self._store = store
        self.owner_id = owner_id
        self._locks: dict[str, asyncio.Lock] = {}

    # ----- validation -------------------------------------------------------------------

    def _validate(self, req: CreateSessionInput) -> tuple[str, SessionSpec, float]:
        session_id = (
            validation.validate_session_id(req.session_id)
            if req.session_id
            else "s-" + secrets.token_hex(8)
        )
        limits = resolve_limits(req.limits, self._config.default_limits, self._config.max_limits)
        uid, gid = validation.parse_user(req.user)
        env = validation.validate_env(req.env)
        if req.network.mode is NetworkMode.ALLOWLIST:
            raise InvalidArgument(
                "network.mode ALLOWLIST is not available on this server yet; use DENY",
                reason="NETWORK_MODE_UNSUPPORTED",
            )
        if req.network.allowed_domains or req.network.allowed_ports:
            raise InvalidArgument(
                "network.allowed_domains and allowed_ports need network.mode ALLOWLIST",
                reason="NETWORK_POLICY_INVALID",
            )
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
        image = req.image or self._config.image
        if len(image) > 512 or "\0" in image:
            raise InvalidArgument("image name is too long or contains NUL", reason="INVALID_IMAGE")
        lease = self._lease(req.lease_ttl_s, "lease_ttl")
        spec = SessionSpec(
            image=image,
            limits=limits,
            shell=ShellPolicy(
                allow=tuple(sorted(set(req.shell.allow))), allow_all=req.shell.allow_all
            ),
            network=NetworkPolicy(mode=NetworkMode.DENY),
            env=env,
            uid=uid,
            gid=gid,
            manifest=manifest,
        )
        return session_id, spec, lease

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
            )
            await self._store.insert(session)
            try:
                session.container_id = await self._engine.create_container(
                    container_config(
                        spec=spec,
                        session_id=session_id,
                        owner_id=self.owner_id,
                        fingerprint=fingerprint,
                        helper_path=self._config.helper,
                        keeper_user=self._config.keeper_user,
                    ),
                    name=container_name(self.owner_id, session_id),
                )
                await self._store.update(session)
                await self._engine.start_container(session.container_id)
                if spec.manifest.files or spec.manifest.directories:
                    await self._populate(session)
                session.state = SessionState.RUNNING
                await self._store.update(session)
            except BaseException:
                await asyncio.shield(self._discard(session))
                raise
            log.info("session created", extra={"session_id": session_id})
            return session

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
            code = await stream.exit_code()
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
        await self._store.delete(session.session_id)

    async def _remove_by_name(self, session_id: str) -> None:
        for c in await self._engine.list_containers({LABEL_OWNER: self.owner_id}):
            if c.get("Labels", {}).get("io.sandboxd.session") == session_id:
                await self._engine.remove_container(str(c["Id"]))

    async def get(self, session_id: str) -> Session:
        validation.validate_session_id(session_id)
        session = await self._store.get(session_id)
        if session is None:
            raise SessionNotFound(session_id)
        if session.state is not SessionState.EXPIRED and session.lease_expires_at <= _now():
            await self._expire(session)
        return session

    async def require_running(self, session_id: str) -> Session:
        """The session, if commands and file operations may use it now."""
        session = await self.get(session_id)
        if session.state is SessionState.EXPIRED:
            raise FailedPrecondition(
                f"the lease of session {session_id!r} expired; its container was removed",
                reason="LEASE_EXPIRED",
                metadata={"session_id": session_id},
            )
        if session.state is not SessionState.RUNNING:
            raise FailedPrecondition(
                f"session {session_id!r} is {session.state.value}, not RUNNING",
                reason="SESSION_NOT_RUNNING",
                metadata={"session_id": session_id, "state": session.state.value},
            )
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

    async def container_lost(self, session: Session) -> FailedPrecondition:
        """Record that the engine no longer has the container; the error to report."""
        async with self._locked(session.session_id):
            current = await self._store.get(session.session_id)
            if current is not None:
                await self._mark_lost(current)
        return FailedPrecondition(
            f"the container of session {session.session_id!r} is gone (removed or the engine "
            "restarted); its workspace cannot be recovered",
            reason="CONTAINER_LOST",
            metadata={"session_id": session.session_id},
        )

    async def _mark_lost(self, session: Session) -> None:
        if session.state is SessionState.RUNNING:
            session.state = SessionState.FAILED
            await self._store.update(session)
            log.warning("container lost", extra={"session_id": session.session_id})

    async def list_sessions(
        self, label_selector: Mapping[str, str], page_size: int, page_token: str
    ) -> tuple[list[Session], str]:
        if page_size < 0:
            raise InvalidArgument("page_size must not be negative", reason="INVALID_PAGE_SIZE")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        after = _decode_token(page_token)
        selector = validation.validate_labels(label_selector)
        sessions = await self._store.page(after=after, limit=size + 1, labels=selector)
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

    async def delete(self, session_id: str) -> None:
        validation.validate_session_id(session_id)
        async with self._locked(session_id):
            session = await self._store.get(session_id)
            if session is None:
                return
            if session.container_id:
                await self._engine.remove_container(session.container_id)
            else:
                await self._remove_by_name(session_id)
            await self._store.delete(session_id)
            log.info("session deleted", extra={"session_id": session_id})

    async def _expire(self, session: Session) -> None:
        """Remove the container of a session whose lease ended; keep the record a while."""
        if session.container_id:
            await self._engine.remove_container(session.container_id)
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
        return count

    async def reconcile(self) -> None:
        """When the engine comes up: note lost containers, remove ours that no record claims.

        Runs beside live calls, so every decision is taken under the session's lock and on a
        fresh read: a create in progress holds its lock until its record says RUNNING.
        """
        for c in await self._engine.list_containers({LABEL_OWNER: self.owner_id}):
            sid = str(c.get("Labels", {}).get("io.sandboxd.session", ""))
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

    async def run_reaper(self, interval_s: float) -> None:
        while True:
            try:
                await self.reap_once()
            except SandboxError as exc:
                log.warning("lease reaper: %s", exc)
            await asyncio.sleep(interval_s)


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
