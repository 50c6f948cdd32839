"""Domain types shared by the session, exec and file modules (no gRPC, no Docker)."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sandboxd.isolation import Isolation


@dataclass(frozen=True)
class Limits:
    """Resource limits; every field is set (defaults already applied)."""

    memory_bytes: int
    cpu_millis: int
    pids: int
    workspace_bytes: int
    file_bytes: int
    output_bytes: int
    command_timeout_s: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Limits:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})


LIMIT_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Limits))


@dataclass(frozen=True)
class LimitsRequest:
    """Limits as a caller asked for them: None means "the server's default"."""

    memory_bytes: int | None = None
    cpu_millis: int | None = None
    pids: int | None = None
    workspace_bytes: int | None = None
    file_bytes: int | None = None
    output_bytes: int | None = None
    command_timeout_s: float | None = None


class WorkspaceStorage(enum.StrEnum):
    """Where /workspace lives: a tmpfs (memory, counted against the sandbox's memory) or a
    sparse ext4 disk on the engine host that outlives its container (sandboxd.storage)."""

    MEMORY = "MEMORY"
    DISK = "DISK"


# A disk workspace's id starts so: the sweep removes only these (named volumes use others).
WORKSPACE_DISK_PREFIX = "ws-"


class SessionState(enum.StrEnum):
    CREATING = "CREATING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    EXPIRED = "EXPIRED"
    FAILED = "FAILED"


class SuspendMode(enum.StrEnum):
    """What a session's current suspension kept: NONE while it is not suspended."""

    NONE = ""
    FILESYSTEM = "FILESYSTEM"  # the workspace only
    MEMORY = "MEMORY"  # processes and memory with the workspace (a gVisor checkpoint)


class PullPolicy(enum.StrEnum):
    """When a create asks the registry for its image (sandboxd.pulls)."""

    IF_NOT_PRESENT = "IF_NOT_PRESENT"
    ALWAYS = "ALWAYS"
    NEVER = "NEVER"


class NetworkMode(enum.StrEnum):
    DENY = "DENY"
    ALLOWLIST = "ALLOWLIST"


@dataclass(frozen=True)
class ProxyQuotas:
    """Quotas of a session's egress proxy; None fields mean "the server's default"."""

    max_connections: int | None = None
    max_dns_lookups: int | None = None
    max_requests: int | None = None
    max_bytes_up: int | None = None
    max_bytes_down: int | None = None
    idle_timeout_s: float | None = None
    tunnel_lifetime_s: float | None = None
    header_timeout_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SecretBinding:
    """A secret the egress proxy adds to requests for its hosts (sandboxd.secrets).

    `value` is the plaintext as a caller sent it: only between the API and validation, which
    seals it (`sealed`, with a key outside the data directory) and drops it. It is never in
    a repr, an answer, the store or the fingerprint. `placeholder` is what the sandbox sees.
    """

    name: str
    hosts: tuple[str, ...] = ()
    header: str = ""
    template: str = ""
    secret_ref: str = ""
    placeholder: str = ""
    sealed: bytes = field(default=b"", repr=False)
    value: bytes | None = field(default=None, repr=False, compare=False)

    def public(self) -> dict[str, Any]:
        """What may be stored, returned and fingerprinted (no value, sealed or not)."""
        return {
            "name": self.name,
            "hosts": list(self.hosts),
            "header": self.header,
            "template": self.template,
            "secret_ref": self.secret_ref,
            "placeholder": self.placeholder,
        }


@dataclass(frozen=True)
class NetworkPolicy:
    mode: NetworkMode = NetworkMode.DENY
    allowed_domains: tuple[str, ...] = ()
    allowed_ports: tuple[int, ...] = ()
    allow_private_networks: bool = False
    quotas: ProxyQuotas = field(default_factory=ProxyQuotas)  # resolved (all set) for ALLOWLIST
    secrets: tuple[SecretBinding, ...] = ()
    refuse_misdirected_secrets: bool = False


@dataclass(frozen=True)
class ShellPolicy:
    allow: tuple[str, ...] = ()
    allow_all: bool = False


@dataclass(frozen=True)
class ManifestFile:
    path: str  # relative to /workspace, already validated
    content: bytes
    mode: int


@dataclass(frozen=True)
class WorkspaceManifest:
    id: str = ""
    files: tuple[ManifestFile, ...] = ()
    directories: tuple[str, ...] = ()  # relative to /workspace, already validated

    def total_bytes(self) -> int:
        return sum(len(f.content) for f in self.files)


@dataclass(frozen=True)
class VolumeMount:
    """One volume of the session's tenant in its sandbox (sandboxd.volumes). `disk` is the
    engine's name of the volume's disk, filled by the server when the create claims it: the
    caller names volumes by id only, and a rebuild mounts the same disk without a lookup."""

    volume_id: str
    path: str
    read_only: bool = False
    disk: str = ""


def workspace_mounts(mounts: Sequence[VolumeMount]) -> frozenset[str]:
    """The names of the folders directly below /workspace that are volumes: the workspace's
    tar paths (archive/, snapshots) skip them."""
    return frozenset(
        m.path[len("/workspace/") :] for m in mounts if m.path.startswith("/workspace/")
    )


@dataclass(frozen=True)
class SessionSpec:
    """Everything that defines a session's container; the fingerprint is derived from it."""

    image: str
    limits: Limits
    shell: ShellPolicy
    network: NetworkPolicy
    env: dict[str, str]
    # The host identity the sandbox's commands run as: allocated by the server, one per
    # session (sandboxd.host_ids), never the caller's choice.
    uid: int
    gid: int
    manifest: WorkspaceManifest
    isolation: Isolation = Isolation.RUNC
    template: str = ""  # the template's name, when the session was created from one
    # The image resolved at create (sandboxd.pulls): reported digest, and the image id a
    # rebuild runs, so a resume never picks up what the tag names later. Not fingerprinted:
    # a retried create of the same request is the same session whatever the tag does.
    image_digest: str = ""
    image_id: str = ""
    # The `user` of the create request, normalised ("uid:gid"): checked and fingerprinted (a
    # retried create is the same request), not the identity. "": the same as `user` (records
    # from before the server allocated identities, whose `user` was the request's).
    requested_user: str = ""
    volumes: tuple[VolumeMount, ...] = ()
    # MEMORY: the tmpfs of limits.workspace_bytes. DISK: the disk `disk_id` (a server-made id,
    # not fingerprinted: bookkeeping) of limits.workspace_bytes, which then is the disk's size.
    storage: WorkspaceStorage = WorkspaceStorage.MEMORY
    disk_id: str = ""

    @property
    def user(self) -> str:
        return f"{self.uid}:{self.gid}"

    @property
    def on_disk(self) -> bool:
        return self.storage is WorkspaceStorage.DISK

    @property
    def memory_workspace_bytes(self) -> int:
        """What the workspace may take of the sandbox's memory: a tmpfs's pages are the
        sandbox's memory, a disk's are not."""
        return 0 if self.on_disk else self.limits.workspace_bytes

    def as_host(self, uid: int, gid: int) -> SessionSpec:
        """This spec running as the host identity `uid:gid` (nothing else changes)."""
        return dataclasses.replace(self, uid=uid, gid=gid)

    def fingerprint(self) -> str:
        """sha256 over the manifest and every security-relevant setting, canonically encoded.

        File contents enter by their own sha256 so the canonical document stays small.
        Labels and the lease are bookkeeping, not part of what the container is.
        """
        doc = {
            "v": 1,
            "image": self.image,
            "limits": self.limits.to_dict(),
            "shell": {"allow": sorted(self.shell.allow), "allow_all": self.shell.allow_all},
            "network": {
                "mode": self.network.mode.value,
                "allowed_domains": sorted(self.network.allowed_domains),
                "allowed_ports": sorted(self.network.allowed_ports),
                "allow_private_networks": self.network.allow_private_networks,
                # Only ALLOWLIST sessions have a proxy; DENY fingerprints stay as they were.
                **(
                    {"quotas": self.network.quotas.to_dict()}
                    if self.network.mode is NetworkMode.ALLOWLIST
                    else {}
                ),
                # Sessions without secrets keep the fingerprints they had.
                **(
                    {
                        "secrets": [b.public() for b in self.network.secrets],
                        "refuse_misdirected_secrets": self.network.refuse_misdirected_secrets,
                    }
                    if self.network.secrets or self.network.refuse_misdirected_secrets
                    else {}
                ),
            },
            "env": dict(sorted(self.env.items())),
            "user": self.requested_user or self.user,
            "manifest": {
                "id": self.manifest.id,
                "files": [
                    {
                        "path": f.path,
                        "mode": f.mode,
                        "sha256": hashlib.sha256(f.content).hexdigest(),
                    }
                    for f in sorted(self.manifest.files, key=lambda f: f.path)
                ],
                "directories": sorted(self.manifest.directories),
            },
            # Only a non-default tier enters, so every runc fingerprint stays as it was.
            **({"isolation": self.isolation.value} if self.isolation is not Isolation.RUNC else {}),
            **({"template": self.template} if self.template else {}),
            # Only sessions with volumes fingerprint them (by id, path and mode: the disk is
            # the server's choice, not the request's).
            **(
                {
                    "volumes": [
                        {"volume_id": v.volume_id, "path": v.path, "read_only": v.read_only}
                        for v in sorted(self.volumes, key=lambda v: v.path)
                    ]
                }
                if self.volumes
                else {}
            ),
            # Only a disk workspace enters, so every memory fingerprint stays as it was.
            **({"storage": self.storage.value} if self.on_disk else {}),
        }
        canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


# Loss.snapshot_id (and Session.restored_from) of a sandbox rebuilt on its disk workspace.
RESTORED_FROM_DISK = "workspace-disk"


@dataclass(frozen=True)
class Loss:
    """The session's sandbox died (its agent, its container, the engine or the host gone):
    its processes ended then, and its workspace is rebuilt from the best source the server
    holds. For a memory workspace that is its latest snapshot (CreateSnapshot, a suspend, a
    fork's origin); a disk workspace outlives its container and is the best source there is
    (`RESTORED_FROM_DISK`: every file as it was). `snapshot_id` empty: no source, the
    workspace is gone."""

    lost_at: datetime
    snapshot_id: str = ""
    snapshot_at: datetime | None = None  # when the restored state was taken
    restored_at: datetime | None = None  # when the rebuild finished; None: not (yet)

    @classmethod
    def on_disk(cls, at: datetime) -> Loss:
        """The loss of a sandbox whose workspace is a disk that outlived it: rebuilt on it."""
        return cls(at, RESTORED_FROM_DISK, at)

    def message(self) -> str:
        if self.snapshot_id == RESTORED_FROM_DISK:
            rebuilt = (
                "was rebuilt" if self.restored_at is not None else "is rebuilt on the next call"
            )
            return (
                "the sandbox died: its processes ended; its workspace is a disk that outlived "
                f"it, and the sandbox {rebuilt} on it with every file as it was"
            )
        if not self.snapshot_id or self.snapshot_at is None:
            return (
                "the sandbox died and no snapshot of its workspace was held: its processes "
                "and its workspace are lost"
            )
        rebuilt = "was rebuilt" if self.restored_at is not None else "is rebuilt on the next call"
        return (
            f"the sandbox died: its processes ended, and its workspace {rebuilt} from "
            f"snapshot {self.snapshot_id} taken {self.snapshot_at.isoformat()}; changes after "
            "that snapshot are lost"
        )


@dataclass
class Session:
    """A session as the server knows it; persisted in the store."""

    session_id: str
    spec: SessionSpec
    fingerprint: str
    state: SessionState
    created_at: datetime
    lease_expires_at: datetime
    labels: dict[str, str] = field(default_factory=dict)
    container_id: str = ""
    tenant: str = "default"  # who may see it (sandboxd.tenancy); "default" without auth
    loss: Loss | None = None  # its sandbox's last death, and what the rebuild brought back
    suspend_mode: SuspendMode = SuspendMode.NONE  # what the current suspension kept
    # Memory suspends it came back from, as (suspended, resumed) epoch seconds: the sandbox's
    # clocks count that time, its timeouts must not (process_adoption.paused_since).
    pauses: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class ExecSpec:
    """One command to run, validated."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    stdin: bytes
    timeout_s: float
    max_output_bytes: int


class OutputStream(enum.Enum):
    STDOUT = 1
    STDERR = 2


@dataclass(frozen=True)
class ExecStarted:
    process_id: str


@dataclass(frozen=True)
class ExecOutput:
    stream: OutputStream
    data: bytes
    offset: int


@dataclass(frozen=True)
class ExecExited:
    exit_code: int
    signal: str
    timed_out: bool
    truncated: bool
    duration_s: float


@dataclass(frozen=True)
class ExecKeepalive:
    """Nothing happened for a keepalive interval: tells a silent command from a dead link."""


ExecEvent = ExecStarted | ExecOutput | ExecExited | ExecKeepalive


class FileType(enum.Enum):
    FILE = 1
    DIRECTORY = 2
    SYMLINK = 3
    OTHER = 4


@dataclass(frozen=True)
class FileInfo:
    path: str
    name: str
    type: FileType
    size: int
    mode: int
    modified_ns: int
    symlink_target: str = ""


@dataclass(frozen=True)
class FileContent:
    content: bytes
    mode: int
    size: int
