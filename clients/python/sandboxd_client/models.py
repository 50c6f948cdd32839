"""The client's own result types: frozen dataclasses, never raw protobuf messages.

Enum fields are short upper-case names without the proto prefix ("RUNNING", "TAR"); times are
aware UTC datetimes (None when the server left them unset); durations are float seconds.
Each type has `from_pb` (reply -> value); inputs have `to_pb`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Literal, Self

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.message import Message

from sandboxd_client._gen.sandboxd.v1 import (
    admin_pb2,
    common_pb2,
    filesystem_pb2,
    process_pb2,
    session_pb2,
    snapshot_pb2,
)

Stream = Literal["stdout", "stderr"]


def enum_name(enum: Any, value: int, prefix: str) -> str:
    """A proto enum value's short name; an unknown (newer) value shows as its number."""
    try:
        name: str = enum.Name(value)
    except ValueError:
        return str(value)
    return name.removeprefix(prefix)


def enum_value(enum: Any, name: str, prefix: str) -> Any:
    """The proto enum value of a short name ("" is the UNSPECIFIED zero)."""
    if not name:
        return 0
    try:
        value = enum.Value(prefix + name.upper().removeprefix(prefix))
    except ValueError:
        raise ValueError(f"{name!r} is not one of {sorted(enum.keys())}") from None
    return value


def seconds(d: duration_pb2.Duration) -> float:
    return float(d.seconds) + d.nanos / 1e9


def duration(value: float | None) -> duration_pb2.Duration | None:
    if value is None:
        return None
    d = duration_pb2.Duration()
    d.FromTimedelta(dt.timedelta(seconds=value))
    return d


def timestamp(msg: Message, name: str) -> dt.datetime | None:
    if not msg.HasField(name):
        return None
    ts: timestamp_pb2.Timestamp = getattr(msg, name)
    return ts.ToDatetime(tzinfo=dt.UTC)


def as_dict(value: Any) -> Any:
    """JSON-ready form of a result (datetimes as ISO 8601 text, bytes as UTF-8 or repr)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: as_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if hasattr(value, "kind_name"):
            out = {"kind": value.kind_name, **out}
        return out
    if isinstance(value, dt.datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: as_dict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_dict(v) for v in value]
    return value


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
class NetworkPolicy:
    """`mode` "DENY" (no network, the default) or "ALLOWLIST" (declared names and ports)."""

    mode: str = "DENY"
    allowed_domains: tuple[str, ...] = ()
    allowed_ports: tuple[int, ...] = ()
    allow_private_networks: bool = False
    quotas: ProxyQuotas | None = None

    @classmethod
    def from_pb(cls, m: common_pb2.NetworkPolicy) -> Self:
        return cls(
            enum_name(common_pb2.NetworkMode, m.mode, "NETWORK_MODE_"),
            tuple(m.allowed_domains),
            tuple(m.allowed_ports),
            m.allow_private_networks,
            ProxyQuotas.from_pb(m.quotas) if m.HasField("quotas") else None,
        )

    def to_pb(self) -> common_pb2.NetworkPolicy:
        return common_pb2.NetworkPolicy(
            mode=enum_value(common_pb2.NetworkMode, self.mode, "NETWORK_MODE_"),
            allowed_domains=list(self.allowed_domains),
            allowed_ports=list(self.allowed_ports),
            allow_private_networks=self.allow_private_networks,
            quotas=self.quotas.to_pb() if self.quotas is not None else None,
        )


# ---- sessions ---------------------------------------------------------------------------------


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
        )


# ---- processes --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Started:
    """The command has started."""

    process_id: str
    kind_name = "started"


@dataclasses.dataclass(frozen=True)
class Output:
    """A chunk of the command's output; `offset` is its byte position within its stream."""

    stream: Stream
    data: bytes
    offset: int
    kind_name = "output"


@dataclasses.dataclass(frozen=True)
class Exited:
    """Always the last event. A timeout, a cap or a kill is reported here, not raised."""

    exit_code: int
    signal: str = ""
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0
    kind_name = "exited"

    @classmethod
    def from_pb(cls, m: process_pb2.ProcessExited) -> Self:
        return cls(m.exit_code, m.signal, m.timed_out, m.truncated, seconds(m.duration))


@dataclasses.dataclass(frozen=True)
class Keepalive:
    """The server's sign of life on a quiet stream (only yielded when asked for)."""

    kind_name = "keepalive"


@dataclasses.dataclass(frozen=True)
class OutputGap:
    """Output an attach asked for that the server no longer holds (its buffer moved on)."""

    stream: Stream
    offset: int
    length: int
    kind_name = "gap"


Event = Started | Output | Exited | Keepalive | OutputGap


def stream_name(value: int) -> Stream:
    return "stderr" if value == process_pb2.OUTPUT_STREAM_STDERR else "stdout"


def event_from_pb(
    resp: process_pb2.ExecResponse
    | process_pb2.InteractResponse
    | process_pb2.AttachProcessResponse,
) -> Event | None:
    kind = resp.WhichOneof("event")
    if kind == "started":
        return Started(resp.started.process_id)
    if kind == "output":
        return Output(stream_name(resp.output.stream), resp.output.data, resp.output.offset)
    if kind == "exited":
        return Exited.from_pb(resp.exited)
    if kind == "keepalive":
        return Keepalive()
    if kind == "gap" and isinstance(resp, process_pb2.AttachProcessResponse):
        return OutputGap(stream_name(resp.gap.stream), resp.gap.offset, resp.gap.length)
    return None  # an event kind newer than this client: skipped


@dataclasses.dataclass(frozen=True)
class RunResult:
    """A command's collected result."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    truncated: bool = False
    signal: str = ""
    duration: float = 0.0
    process_id: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.truncated

    @classmethod
    def from_pb(cls, r: process_pb2.RunResponse) -> Self:
        return cls(
            r.exit_code,
            r.stdout,
            r.stderr,
            r.timed_out,
            r.truncated,
            r.signal,
            seconds(r.duration),
            r.process_id,
        )


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """A background process (StartProcess); output offsets say what attach can replay."""

    process_id: str
    session_id: str
    argv: tuple[str, ...]
    cwd: str
    state: str  # RUNNING, EXITED
    started_at: dt.datetime | None
    exited: Exited | None
    stdout_bytes: int
    stderr_bytes: int
    stdout_first_offset: int
    stderr_first_offset: int

    @classmethod
    def from_pb(cls, m: process_pb2.Process) -> Self:
        return cls(
            m.process_id,
            m.session_id,
            tuple(m.argv),
            m.cwd,
            enum_name(process_pb2.ProcessState, m.state, "PROCESS_STATE_"),
            timestamp(m, "started_at"),
            Exited.from_pb(m.exited) if m.HasField("exited") else None,
            m.stdout_bytes,
            m.stderr_bytes,
            m.stdout_first_offset,
            m.stderr_first_offset,
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
