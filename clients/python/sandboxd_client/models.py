"""The client's own result types: frozen dataclasses, never raw protobuf messages.

Enum fields are short upper-case names without the proto prefix ("RUNNING", "TAR"); times are
aware UTC datetimes (None when the server left them unset); durations are float seconds.
Each type has `from_pb` (reply -> value); inputs have `to_pb`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Any, Self

from sandboxd_client._convert import (
    as_dict,
    duration,
    enum_name,
    enum_value,
    seconds,
    timestamp,
)
from sandboxd_client._lazy import lazy
from sandboxd_client.events import (
    Event,
    Exited,
    Keepalive,
    Output,
    OutputGap,
    ProcessInfo,
    RunResult,
    Started,
    Stream,
    event_from_pb,
)
from sandboxd_client.volumes import VolumeMount

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import (
        admin_pb2,
        common_pb2,
        filesystem_pb2,
        leases_pb2,
        secrets_pb2,
        session_pb2,
        snapshot_pb2,
    )
else:  # loaded on first use (sandboxd_client._lazy)
    admin_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.admin_pb2")
    common_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.common_pb2")
    filesystem_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.filesystem_pb2")
    leases_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.leases_pb2")
    secrets_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.secrets_pb2")
    session_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.session_pb2")
    snapshot_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.snapshot_pb2")

__all__ = [
    "ArchiveImported",
    "EgressEvent",
    "Event",
    "Exited",
    "FileInfo",
    "Keepalive",
    "NetworkPolicy",
    "Output",
    "OutputGap",
    "ProcessInfo",
    "ProxyQuotas",
    "ResourceLimits",
    "RunResult",
    "SecurityDefaults",
    "ServerInfo",
    "SessionInfo",
    "ShellPolicy",
    "SnapshotInfo",
    "StateReason",
    "Started",
    "Stream",
    "SweepResult",
    "as_dict",
    "duration",
    "enum_value",
    "event_from_pb",
]


# ---- policies and limits ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ResourceLimits:
    """Zero fields take the server's default."""

    memory_bytes: int = 0
    cpu_millis: int = 0
    pids: int = 0
    workspace_bytes: int = 0
    file_bytes: int = 0
    output_bytes: int = 0
    command_timeout: float | None = None

    @classmethod
    def from_pb(cls, m: common_pb2.ResourceLimits) -> Self:
        return cls(
            m.memory_bytes,
            m.cpu_millis,
            m.pids,
            m.workspace_bytes,
            m.file_bytes,
            m.output_bytes,
            seconds(m.command_timeout) if m.HasField("command_timeout") else None,
        )

    def to_pb(self) -> common_pb2.ResourceLimits:
        return common_pb2.ResourceLimits(
            memory_bytes=self.memory_bytes,
            cpu_millis=self.cpu_millis,
            pids=self.pids,
            workspace_bytes=self.workspace_bytes,
            file_bytes=self.file_bytes,
            output_bytes=self.output_bytes,
            command_timeout=duration(self.command_timeout),
        )


@dataclasses.dataclass(frozen=True)
class ShellPolicy:
    allow: tuple[str, ...] = ()
    allow_all: bool = False

    @classmethod
    def from_pb(cls, m: common_pb2.ShellPolicy) -> Self:
        return cls(tuple(m.allow), m.allow_all)


@dataclasses.dataclass(frozen=True)
class ProxyQuotas:
    """Quotas of a session's egress proxy; zero/None takes the server's default."""

    max_connections: int = 0
    max_dns_lookups: int = 0
    max_requests: int = 0
    max_bytes_up: int = 0
    max_bytes_down: int = 0
    idle_timeout: float | None = None
    tunnel_lifetime: float | None = None
    header_timeout: float | None = None

    @classmethod
    def from_pb(cls, m: common_pb2.ProxyQuotas) -> Self:
        def opt(name: Any) -> float | None:
            return seconds(getattr(m, name)) if m.HasField(name) else None

        return cls(
            m.max_connections,
            m.max_dns_lookups,
            m.max_requests,
            m.max_bytes_up,
            m.max_bytes_down,
            opt("idle_timeout"),
            opt("tunnel_lifetime"),
            opt("header_timeout"),
        )

    def to_pb(self) -> common_pb2.ProxyQuotas:
        return common_pb2.ProxyQuotas(
            max_connections=self.max_connections,
            max_dns_lookups=self.max_dns_lookups,
            max_requests=self.max_requests,
            max_bytes_up=self.max_bytes_up,
            max_bytes_down=self.max_bytes_down,
            idle_timeout=duration(self.idle_timeout),
            tunnel_lifetime=duration(self.tunnel_lifetime),
            header_timeout=duration(self.header_timeout),
        )


@dataclasses.dataclass(frozen=True)
class SecretBinding:
    """A secret the server's egress proxy adds for `hosts`; the sandbox's variable `name` holds
    a placeholder. `value` is write-only (a session read back has it empty); or `secret_ref`."""

    name: str
    hosts: tuple[str, ...] = ()
    value: bytes = dataclasses.field(default=b"", repr=False)
    secret_ref: str = ""
    header: str = ""
    template: str = ""

    @classmethod
    def from_pb(cls, m: secrets_pb2.SecretBinding) -> Self:
        return cls(m.name, tuple(m.hosts), m.value, m.secret_ref, m.header, m.template)

    def to_pb(self) -> secrets_pb2.SecretBinding:
        return secrets_pb2.SecretBinding(
            name=self.name,
            hosts=list(self.hosts),
            value=self.value,
            secret_ref=self.secret_ref,
            header=self.header,
            template=self.template,
        )


@dataclasses.dataclass(frozen=True)
class NetworkPolicy:
    """`mode` "DENY" (no network, the default) or "ALLOWLIST" (declared names and ports)."""

    mode: str = "DENY"
    allowed_domains: tuple[str, ...] = ()
    allowed_ports: tuple[int, ...] = ()
    allow_private_networks: bool = False
    quotas: ProxyQuotas | None = None
    secrets: tuple[SecretBinding, ...] = ()
    refuse_misdirected_secrets: bool = False

    @classmethod
    def from_pb(cls, m: common_pb2.NetworkPolicy) -> Self:
        return cls(
            enum_name(common_pb2.NetworkMode, m.mode, "NETWORK_MODE_"),
            tuple(m.allowed_domains),
            tuple(m.allowed_ports),
            m.allow_private_networks,
            ProxyQuotas.from_pb(m.quotas) if m.HasField("quotas") else None,
            tuple(SecretBinding.from_pb(b) for b in m.secrets),
            m.refuse_misdirected_secrets,
        )

    def to_pb(self) -> common_pb2.NetworkPolicy:
        return common_pb2.NetworkPolicy(
            mode=enum_value(common_pb2.NetworkMode, self.mode, "NETWORK_MODE_"),
            allowed_domains=list(self.allowed_domains),
            allowed_ports=list(self.allowed_ports),
            allow_private_networks=self.allow_private_networks,
            quotas=self.quotas.to_pb() if self.quotas is not None else None,
            secrets=[b.to_pb() for b in self.secrets],
            refuse_misdirected_secrets=self.refuse_misdirected_secrets,
        )


# ---- sessions ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StateReason:
    """Why a session is in its state: the error reason its calls get, for a person, and
    whether a call can bring it back."""

    reason: str
    message: str
    recoverable: bool

    @classmethod
    def from_pb(cls, m: session_pb2.SessionStateReason) -> Self:
        return cls(m.reason, m.message, m.recoverable)


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    session_id: str
    state: str  # CREATING, RUNNING, SUSPENDED, EXPIRED, FAILED
    image: str = ""
    fingerprint: str = ""
    created_at: dt.datetime | None = None
    lease_expires_at: dt.datetime | None = None
    limits: ResourceLimits = ResourceLimits()
    network: NetworkPolicy = NetworkPolicy()
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    assurance: str = ""
    shell: ShellPolicy = ShellPolicy()
    user: str = ""
    workspace_id: str = ""
    on_expiry: str = ""  # DELETE, SUSPEND, SNAPSHOT_THEN_DELETE
    renew_on_activity: bool = False
    end_reason: str = ""  # why an ended session ended
    # Why the session is EXPIRED or FAILED, and whether it can recover; None while it runs.
    state_reason: StateReason | None = None
    isolation: str = ""  # RUNC or GVISOR
    template: str = ""
    image_digest: str = ""  # the digest it runs (a resume or fork runs the same)
    volumes: tuple[VolumeMount, ...] = ()  # the volumes mounted in it

    @classmethod
    def from_pb(cls, m: session_pb2.Session) -> Self:
        return cls(
            session_id=m.session_id,
            state=enum_name(session_pb2.SessionState, m.state, "SESSION_STATE_"),
            image=m.image,
            fingerprint=m.fingerprint,
            created_at=timestamp(m, "created_at"),
            lease_expires_at=timestamp(m, "lease_expires_at"),
            limits=ResourceLimits.from_pb(m.limits),
            network=NetworkPolicy.from_pb(m.network),
            labels=dict(m.labels),
            assurance=enum_name(common_pb2.Assurance, m.assurance, "ASSURANCE_"),
            shell=ShellPolicy.from_pb(m.shell),
            user=m.user,
            workspace_id=m.workspace_id,
            on_expiry=enum_name(leases_pb2.ExpiryAction, m.on_expiry, "EXPIRY_ACTION_"),
            renew_on_activity=m.renew_on_activity,
            end_reason=m.end_reason,
            state_reason=StateReason.from_pb(m.state_reason)
            if m.HasField("state_reason")
            else None,
            isolation=enum_name(common_pb2.Isolation, m.isolation, "ISOLATION_"),
            template=m.template,
            image_digest=m.image_digest,
            volumes=tuple(VolumeMount(v.volume_id, v.path, v.read_only) for v in m.volumes),
        )


@dataclasses.dataclass(frozen=True)
class EgressEvent:
    seq: int
    time: dt.datetime | None
    method: str
    host: str
    port: int
    verdict: str  # ALLOWED, REFUSED
    reason: str
    address: str
    bytes_up: int
    bytes_down: int
    duration: float
    ended: str
    kind: str = "egress"  # or secret_injected, secret_misdirected
    secret: str = ""  # the secret's name for those kinds

    @classmethod
    def from_pb(cls, m: session_pb2.EgressEvent) -> Self:
        return cls(
            m.seq,
            timestamp(m, "time"),
            m.method,
            m.host,
            m.port,
            enum_name(session_pb2.EgressVerdict, m.verdict, "EGRESS_VERDICT_"),
            m.reason,
            m.address,
            m.bytes_up,
            m.bytes_down,
            seconds(m.duration),
            m.ended,
            m.kind or "egress",
            m.secret,
        )


# ---- files, archives, snapshots ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FileInfo:
    path: str
    name: str
    type: str  # FILE, DIRECTORY, SYMLINK, OTHER
    size: int
    mode: int
    modified_at: dt.datetime | None
    symlink_target: str = ""

    @classmethod
    def from_pb(cls, m: filesystem_pb2.FileInfo) -> Self:
        return cls(
            m.path,
            m.name,
            enum_name(filesystem_pb2.FileType, m.type, "FILE_TYPE_"),
            m.size,
            m.mode,
            timestamp(m, "modified_at"),
            m.symlink_target,
        )


@dataclasses.dataclass(frozen=True)
class ArchiveImported:
    """What an import wrote: members (files, folders, links) and bytes of file content."""

    files: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class SnapshotInfo:
    snapshot_id: str
    session_id: str
    size_bytes: int
    sha256: str
    created_at: dt.datetime | None
    kind: str  # TAR, IMAGE
    labels: dict[str, str]
    image: str

    @classmethod
    def from_pb(cls, m: snapshot_pb2.Snapshot) -> Self:
        return cls(
            m.snapshot_id,
            m.session_id,
            m.size_bytes,
            m.sha256,
            timestamp(m, "created_at"),
            enum_name(snapshot_pb2.SnapshotKind, m.kind, "SNAPSHOT_KIND_"),
            dict(m.labels),
            m.image,
        )


# ---- the server --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SecurityDefaults:
    user: str
    read_only_root_filesystem: bool
    capabilities_dropped: tuple[str, ...]
    no_new_privileges: bool
    seccomp_profile: str
    init: bool
    network_mode: str
    limits: ResourceLimits
    commands_denied_by_default: bool
    lease_seconds: int
    image: str

    @classmethod
    def from_pb(cls, m: admin_pb2.SecurityDefaults) -> Self:
        return cls(
            m.user,
            m.read_only_root_filesystem,
            tuple(m.capabilities_dropped),
            m.no_new_privileges,
            m.seccomp_profile,
            m.init,
            enum_name(common_pb2.NetworkMode, m.network_mode, "NETWORK_MODE_"),
            ResourceLimits.from_pb(m.limits),
            m.commands_denied_by_default,
            m.lease_seconds,
            m.image,
        )


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    version: str
    api_version: str
    features: tuple[str, ...]
    isolation_tiers: tuple[str, ...]
    docker_api_version: str
    security_defaults: SecurityDefaults
    limits_max: ResourceLimits
    assurance: str
    lease_max_seconds: int
    egress_filter: str
    proxy_quotas_default: ProxyQuotas
    proxy_quotas_max: ProxyQuotas

    def has(self, feature: str) -> bool:
        return feature in self.features

    @classmethod
    def from_pb(cls, m: admin_pb2.GetServerInfoResponse) -> Self:
        return cls(
            m.version,
            m.api_version,
            tuple(m.features),
            tuple(enum_name(common_pb2.Isolation, t, "ISOLATION_") for t in m.isolation_tiers),
            m.docker_api_version,
            SecurityDefaults.from_pb(m.security_defaults),
            ResourceLimits.from_pb(m.limits_max),
            enum_name(common_pb2.Assurance, m.assurance, "ASSURANCE_"),
            m.lease_max_seconds,
            enum_name(admin_pb2.EgressFilter, m.egress_filter, "EGRESS_FILTER_"),
            ProxyQuotas.from_pb(m.proxy_quotas_default),
            ProxyQuotas.from_pb(m.proxy_quotas_max),
        )


@dataclasses.dataclass(frozen=True)
class SweepResult:
    expired_sessions: int
    removed_containers: int
    removed_networks: int
    removed_images: int

    @classmethod
    def from_pb(cls, m: admin_pb2.SweepResponse) -> Self:
        return cls(m.expired_sessions, m.removed_containers, m.removed_networks, m.removed_images)
