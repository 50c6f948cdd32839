"""A create request checked into a session spec: pure validation, the one place for it.

Nothing here touches the engine, the store or the clock: `check_create` turns what the
servicer decoded (`CreateSessionInput`) into a `CheckedCreate` or raises the domain error of
the first bad field. Generic validators shared with exec and files (paths, env, ids, labels,
images, users) live in `sandboxd.validation` and are called from here.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sandboxd import tenancy, validation
from sandboxd.config import Config
from sandboxd.egress.policy import validate_policy
from sandboxd.errors import InvalidArgument, ResourceExhausted
from sandboxd.isolation import Isolation, IsolationTiers
from sandboxd.models import (
    LIMIT_NAMES,
    WORKSPACE_DISK_PREFIX,
    Limits,
    LimitsRequest,
    ManifestFile,
    NetworkMode,
    NetworkPolicy,
    PullPolicy,
    SessionSpec,
    ShellPolicy,
    VolumeMount,
    WorkspaceManifest,
    WorkspaceStorage,
)
from sandboxd.reasons import Reason
from sandboxd.secrets import bindings as secret_bindings
from sandboxd.templates import resolve_template
from sandboxd.volumes import checks as volume_checks

MAX_MANIFEST_ENTRIES = 10_000
MAX_ALLOW_ENTRIES = 256
MIN_MEMORY_BYTES = 6 * 1024 * 1024  # a Docker minimum
MIN_CPU_MILLIS = 10  # the kernel's smallest CPU quota is 1 ms per 100 ms

# Called for an ALLOWLIST policy: raises when this server cannot give one (no egress).
AllowlistCheck = Callable[[], None] | None


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
    isolation: Isolation | None = None  # None: the server's default tier
    template: str = ""
    pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    volumes: tuple[VolumeMount, ...] = ()
    storage: WorkspaceStorage | None = None  # None: the operator's default
    size_bytes: int = 0  # a disk workspace's; 0: the operator's default


@dataclass(frozen=True)
class CheckedCreate:
    session_id: str
    spec: SessionSpec
    lease_s: float
    labels: dict[str, str]
    from_snapshot_id: str
    pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT


def check_create(
    req: CreateSessionInput,
    config: Config,
    allowlist: AllowlistCheck,
    tiers: IsolationTiers | None = None,
    *,
    own_templates: Mapping[str, str] | None = None,
) -> CheckedCreate:
    """Every field of a create request, in the order a caller reads the errors."""
    if req.session_id:
        session_id = validation.validate_session_id(req.session_id)
        tenancy.check_session_id(session_id)
    else:
        session_id = tenancy.generated_session_id(secrets.token_hex(8))
    storage, disk_bytes = check_storage(req.storage, req.size_bytes, req.limits, config)
    asked = dataclasses.replace(req.limits, workspace_bytes=None) if disk_bytes else req.limits
    limits = resolve_limits(asked, config.limits.default, config.limits.max)
    if disk_bytes:  # a disk's size is its workspace_bytes: every cap that reads it follows
        limits = dataclasses.replace(limits, workspace_bytes=disk_bytes)
    # Checked as always and fingerprinted; the identity is the server's to allocate
    # (sessions/host_ids.py): until then the spec runs as what was asked.
    uid, gid = validation.parse_user(req.user)
    check_reserved_user(uid, gid, config.engine.keeper_user)
    env = validation.validate_env(req.env)
    network = check_network(req.network, allowlist)
    isolation = check_isolation(req.isolation, tiers)
    shell = check_shell(req.shell)
    manifest = check_manifest(req.manifest, limits)
    named = resolve_template(
        req.template,
        req.image,
        default_image=config.engine.image,
        python_image=config.templates.python_image,
        base_image=config.templates.base_image,
        own=own_templates or {},
    )
    image = validation.validate_image(named or config.engine.image)
    lease = check_lease(req.lease_ttl_s, "lease_ttl", config)
    volumes = volume_checks.check_mounts(req.volumes, config.volumes.mounts_per_session)
    spec = SessionSpec(
        image=image,
        limits=limits,
        shell=shell,
        network=network,
        env=env,
        uid=uid,
        gid=gid,
        manifest=manifest,
        isolation=isolation,
        template=req.template,
        requested_user=f"{uid}:{gid}",
        volumes=volumes,
        storage=storage,
        # Made here, so the record names its disk from the first write (the sweep keeps it).
        disk_id=WORKSPACE_DISK_PREFIX + secrets.token_hex(12) if disk_bytes else "",
    )
    labels = validation.validate_labels(req.labels)
    return CheckedCreate(
        session_id, spec, lease, labels, req.from_snapshot_id, PullPolicy(req.pull_policy)
    )


MIN_DISK_BYTES = 16 * 1024 * 1024  # ext4 with its journal needs a few MiB of its own


def check_storage(
    asked: WorkspaceStorage | None, size_bytes: int, limits: LimitsRequest, config: Config
) -> tuple[WorkspaceStorage, int]:
    """Where the workspace lives, and a disk's size (0 for memory). A disk's size is
    `workspace.size_bytes` (0: the default), up to `max_disk_bytes`; `limits.workspace_bytes`,
    the tmpfs's size, may be left unset or say the same; a memory workspace takes no
    size_bytes (its size is limits.workspace_bytes, as before)."""
    section = config.limits
    storage = asked or WorkspaceStorage(section.default_workspace_storage.upper())
    meta = {"limit": "workspace.size_bytes"}
    if size_bytes < 0:
        raise InvalidArgument(
            f"workspace.size_bytes must not be negative (got {size_bytes}); 0 asks for the default",
            reason=Reason.LIMIT_INVALID,
            metadata=meta,
        )
    if storage is WorkspaceStorage.MEMORY:
        if size_bytes:
            raise InvalidArgument(
                "workspace.size_bytes is the size of a disk workspace; a memory workspace's is "
                "limits.workspace_bytes (or ask for storage WORKSPACE_STORAGE_DISK)",
                reason=Reason.LIMIT_INVALID,
                metadata=meta,
            )
        return storage, 0
    size = size_bytes or section.default_disk_bytes
    validation.at_most(size, section.max_disk_bytes, name=meta["limit"])
    if size < MIN_DISK_BYTES:
        raise InvalidArgument(
            f"workspace.size_bytes = {size} is below the smallest disk, {MIN_DISK_BYTES}",
            reason=Reason.LIMIT_INVALID,
            metadata=meta,
        )
    if limits.workspace_bytes is not None and limits.workspace_bytes != size:
        raise InvalidArgument(
            f"limits.workspace_bytes = {limits.workspace_bytes} differs from the disk's "
            f"workspace.size_bytes = {size}: leave it unset for a disk workspace",
            reason=Reason.LIMIT_INVALID,
            metadata={"limit": "workspace_bytes"},
        )
    return storage, size


def check_reserved_user(uid: int, gid: int, keeper_user: str) -> None:
    """The keeper's uid and gid are the server's: a session running as
    either could signal the container's main process (`kill -9 -1`) or own its files, and
    end the container with the workspace in it. Root is refused by parse_user already."""
    k_uid, _, k_gid = keeper_user.partition(":")
    if uid == int(k_uid) or gid == int(k_gid):  # numeric: config.py checks keeper_user
        shown = f"{uid}:{gid}"
        raise InvalidArgument(
            f"user {shown} is refused: uid {k_uid} and gid {k_gid} are reserved for the "
            "server's own process in every sandbox; choose another numeric 'uid:gid'",
            reason=Reason.INVALID_USER,
            metadata={"user": shown},
        )


# Limits that are durations: checked (and clamped) as every duration of a request is.
DURATION_LIMITS = frozenset({"command_timeout_s"})


def resolve_limits(requested: LimitsRequest, defaults: Limits, maxima: Limits) -> Limits:
    """Fill unset limits from the defaults; refuse any above the server's maximum."""
    values = {}
    for name in LIMIT_NAMES:
        asked = getattr(requested, name)
        if asked is None:
            values[name] = getattr(defaults, name)
            continue
        proto = _proto_limit_name(name)
        if name in DURATION_LIMITS:
            values[name] = validation.positive_duration(
                asked,
                name=f"limits.{proto}",
                maximum=getattr(maxima, name),
                reason=Reason.LIMIT_INVALID,
                metadata={"limit": proto},
            )
            continue
        if asked <= 0:
            raise InvalidArgument(
                f"limits.{proto} must be positive (got {asked})",
                reason=Reason.LIMIT_INVALID,
                metadata={"limit": proto},
            )
        maximum = getattr(maxima, name)
        values[name] = validation.at_most(asked, maximum, name=f"limits.{proto}", limit=proto)
    limits = Limits(**values)
    if limits.memory_bytes < MIN_MEMORY_BYTES:
        raise InvalidArgument(
            "limits.memory_bytes must be at least 6 MiB (a Docker minimum)",
            reason=Reason.LIMIT_INVALID,
            metadata={"limit": "memory_bytes"},
        )
    if limits.cpu_millis < MIN_CPU_MILLIS:
        raise InvalidArgument(
            "limits.cpu_millis must be at least 10 (the kernel's smallest CPU quota is 1 ms)",
            reason=Reason.LIMIT_INVALID,
            metadata={"limit": "cpu_millis"},
        )
    return limits


def _proto_limit_name(name: str) -> str:
    return "command_timeout" if name == "command_timeout_s" else name


def check_isolation(asked: Isolation | None, tiers: IsolationTiers | None) -> Isolation:
    """The tier of a create request. Without `tiers` (an embedding without an engine check)
    only runc exists. Every tier allows ALLOWLIST: no sandbox has a network interface (runsc
    runs with --network=none, runc with network mode none), egress goes over the agent's
    channel.
    """
    if tiers is None:
        tier = IsolationTiers(Isolation.RUNC, {Isolation.RUNC}).choose(asked)
    else:
        tier = tiers.choose(asked, tenancy.current_grants().isolation)
    return tier


def check_network(
    asked: NetworkPolicy, allowlist: AllowlistCheck, *, live: bool = False
) -> NetworkPolicy:
    """`live`: an update of a running session, whose secrets are settled against its own."""
    network = validate_policy(asked)
    if not live:
        network = dataclasses.replace(
            network, secrets=secret_bindings.settle(network.secrets, None)
        )
    if network.mode is NetworkMode.ALLOWLIST:
        if allowlist is None:
            raise InvalidArgument(
                "network.mode ALLOWLIST is not available on this server; use DENY",
                reason=Reason.NETWORK_MODE_UNSUPPORTED,
            )
        allowlist()
    return network


def check_shell(shell: ShellPolicy) -> ShellPolicy:
    if len(shell.allow) > MAX_ALLOW_ENTRIES:
        raise InvalidArgument(
            f"shell.allow has more than {MAX_ALLOW_ENTRIES} entries", reason=Reason.INVALID_SHELL
        )
    for name in shell.allow:
        if not name or "/" in name or "\0" in name or len(name) > 255:
            raise InvalidArgument(
                f"shell.allow entry {name!r} must be a bare command name",
                reason=Reason.INVALID_SHELL,
            )
    return ShellPolicy(allow=tuple(sorted(set(shell.allow))), allow_all=shell.allow_all)


def check_manifest(manifest: WorkspaceManifest, limits: Limits) -> WorkspaceManifest:
    if len(manifest.files) + len(manifest.directories) > MAX_MANIFEST_ENTRIES:
        raise InvalidArgument(
            f"workspace manifest has more than {MAX_MANIFEST_ENTRIES} entries",
            reason=Reason.MANIFEST_TOO_LARGE,
        )
    if len(manifest.id) > 256:
        raise InvalidArgument(
            "workspace.id is longer than 256 characters", reason=Reason.INVALID_MANIFEST
        )
    files: list[ManifestFile] = []
    seen: set[str] = set()
    for f in manifest.files:
        rel = validation.workspace_relpath(f.path, allow_root=False)
        if rel in seen:
            raise InvalidArgument(
                f"workspace file {rel!r} is declared twice", reason=Reason.INVALID_MANIFEST
            )
        seen.add(rel)
        if len(f.content) > limits.file_bytes:
            raise ResourceExhausted(
                f"workspace file {rel!r} is {len(f.content)} bytes, over the file cap of "
                f"{limits.file_bytes}",
                reason=Reason.FILE_TOO_LARGE,
                metadata={"path": rel, "limit": str(limits.file_bytes)},
            )
        files.append(
            ManifestFile(rel, f.content, validation.validate_file_mode(f.mode, default=0o644))
        )
    dirs = tuple(validation.workspace_relpath(d, allow_root=False) for d in manifest.directories)
    for rel in seen:
        if (
            rel in dirs
            or any(d.startswith(rel + "/") for d in dirs)
            or any(o.startswith(rel + "/") for o in seen)
        ):
            raise InvalidArgument(
                f"workspace path {rel!r} is declared as a file and used as a directory",
                reason=Reason.INVALID_MANIFEST,
            )
    result = WorkspaceManifest(id=manifest.id, files=tuple(files), directories=dirs)
    if result.total_bytes() > limits.workspace_bytes:
        raise ResourceExhausted(
            f"workspace manifest holds {result.total_bytes()} bytes, over the workspace cap "
            f"of {limits.workspace_bytes}",
            reason=Reason.WORKSPACE_FULL,
        )
    return result


def check_lease(ttl_s: float | None, field_name: str, config: Config) -> float:
    """The lease to give, in seconds; a lease's end is a clock time, so it is clamped to the
    span the server computes with (validation.MAX_SPAN_S), the default included."""
    if ttl_s is None:
        return min(config.leases.default_s, validation.MAX_SPAN_S)
    return validation.positive_duration(
        ttl_s, name=field_name, maximum=config.leases.max_s, reason=Reason.LEASE_INVALID
    )
