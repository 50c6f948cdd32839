"""Proto <-> domain conversion; no logic beyond translating fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from google.protobuf import duration_pb2

from sandboxd import validation
from sandboxd.api import egress_convert, image_convert
from sandboxd.api.pb_time import datetime_pb, duration_pb, timestamp_pb
from sandboxd.dir_watch import FileEvent
from sandboxd.errors import InvalidArgument
from sandboxd.isolation import Isolation
from sandboxd.models import (
    ExecExited,
    FileInfo,
    FileType,
    Limits,
    LimitsRequest,
    Loss,
    ManifestFile,
    NetworkMode,
    NetworkPolicy,
    Session,
    SessionState,
    ShellPolicy,
    SuspendMode,
    VolumeMount,
    WorkspaceManifest,
    WorkspaceStorage,
)
from sandboxd.reasons import Reason
from sandboxd.sessions import CreateSessionInput
from sandboxd.state_reason import state_reason
from sandboxd.v1 import (
    common_pb2,
    filesystem_pb2,
    process_pb2,
    session_pb2,
    volumes_pb2,
    watch_pb2,
)

_STATE = {
    SessionState.CREATING: session_pb2.SESSION_STATE_CREATING,
    SessionState.RUNNING: session_pb2.SESSION_STATE_RUNNING,
    SessionState.SUSPENDED: session_pb2.SESSION_STATE_SUSPENDED,
    SessionState.EXPIRED: session_pb2.SESSION_STATE_EXPIRED,
    SessionState.FAILED: session_pb2.SESSION_STATE_FAILED,
}


T = TypeVar("T")


def _from_pb(
    value: int, unspecified: int, known: Mapping[int, T], unknown: str, **metadata: str
) -> T | None:
    """A request's enum in the domain's terms: None for `unspecified` (the caller left it to
    the server), the value `known` maps it to, or INVALID_ARGUMENT (`unknown`, with `{value}`
    filled in): a number this server does not know (a newer client's) is refused, never
    taken for the default."""
    if value == unspecified:
        return None
    if value not in known:
        raise InvalidArgument(
            unknown.format(value=value), reason=Reason.INVALID_ARGUMENT, metadata=metadata
        )
    return known[value]


_STATE_IN: dict[int, SessionState] = {v: k for k, v in _STATE.items()}


def session_state(pb: session_pb2.SessionState.ValueType) -> SessionState | None:
    """A state filter: None for UNSPECIFIED (any state); an unknown value is refused."""
    unspecified = session_pb2.SESSION_STATE_UNSPECIFIED
    return _from_pb(pb, unspecified, _STATE_IN, "unknown session state {value}")


_NETWORK_MODE_TO_PB = {
    NetworkMode.DENY: common_pb2.NETWORK_MODE_DENY,
    NetworkMode.ALLOWLIST: common_pb2.NETWORK_MODE_ALLOWLIST,
}
_FILE_TYPE = {
    FileType.FILE: filesystem_pb2.FILE_TYPE_FILE,
    FileType.DIRECTORY: filesystem_pb2.FILE_TYPE_DIRECTORY,
    FileType.SYMLINK: filesystem_pb2.FILE_TYPE_SYMLINK,
    FileType.OTHER: filesystem_pb2.FILE_TYPE_OTHER,
}


def duration_s(value: duration_pb2.Duration) -> float:
    return validation.duration_seconds(value.seconds, value.nanos)


def optional_duration_s(value: duration_pb2.Duration, present: bool) -> float | None:
    """None when the field is unset or zero: "use the default"."""
    if not present:
        return None
    seconds = duration_s(value)
    return None if seconds == 0 else seconds


# A session needs this many processes before a command can do anything: the container's init
# and idle keeper, a supervisor and its monitor (helper/README.md), the command and a child or
# two. Fewer made a session that could not run even `sh -c 'echo | cat'`, or write its manifest.
MIN_PIDS = 8


def limits_request(pb: common_pb2.ResourceLimits) -> LimitsRequest:
    def opt(v: int) -> int | None:
        return None if v == 0 else v

    if 0 < pb.pids < MIN_PIDS:
        raise InvalidArgument(
            f"limits.pids must be at least {MIN_PIDS} (got {pb.pids}): the container's init, "
            "the supervisor and the command's own processes count too",
            reason=Reason.LIMIT_INVALID,
            metadata={"limit": "pids"},
        )

    return LimitsRequest(
        memory_bytes=opt(pb.memory_bytes),
        cpu_millis=opt(pb.cpu_millis),
        pids=opt(pb.pids),
        workspace_bytes=opt(pb.workspace_bytes),
        file_bytes=opt(pb.file_bytes),
        output_bytes=opt(pb.output_bytes),
        command_timeout_s=optional_duration_s(pb.command_timeout, pb.HasField("command_timeout")),
    )


ISOLATION_PB = {
    Isolation.RUNC: common_pb2.ISOLATION_RUNC,
    Isolation.GVISOR: common_pb2.ISOLATION_GVISOR,
}


_ISOLATION_IN: dict[int, Isolation] = {v: k for k, v in ISOLATION_PB.items()}


def isolation_from_pb(value: int) -> Isolation | None:
    """UNSPECIFIED is the server's default (None); a number this server does not know is an
    invalid argument, not a silent default."""
    unspecified = common_pb2.ISOLATION_UNSPECIFIED
    return _from_pb(value, unspecified, _ISOLATION_IN, "unknown isolation {value}")


def limits_pb(limits: Limits) -> common_pb2.ResourceLimits:
    return common_pb2.ResourceLimits(
        memory_bytes=limits.memory_bytes,
        cpu_millis=limits.cpu_millis,
        pids=limits.pids,
        workspace_bytes=limits.workspace_bytes,
        file_bytes=limits.file_bytes,
        output_bytes=limits.output_bytes,
        command_timeout=duration_pb(limits.command_timeout_s),
    )


def network_policy(pb: common_pb2.NetworkPolicy) -> NetworkPolicy:
    mode = (
        NetworkMode.ALLOWLIST if pb.mode == common_pb2.NETWORK_MODE_ALLOWLIST else NetworkMode.DENY
    )
    return NetworkPolicy(
        mode=mode,
        allowed_domains=tuple(pb.allowed_domains),
        allowed_ports=tuple(pb.allowed_ports),
        allow_private_networks=pb.allow_private_networks,
        quotas=egress_convert.quotas(pb.quotas),
        secrets=egress_convert.secrets(pb.secrets),
        refuse_misdirected_secrets=pb.refuse_misdirected_secrets,
    )


def network_pb(policy: NetworkPolicy) -> common_pb2.NetworkPolicy:
    return common_pb2.NetworkPolicy(
        mode=_NETWORK_MODE_TO_PB[policy.mode],
        allowed_domains=list(policy.allowed_domains),
        allowed_ports=list(policy.allowed_ports),
        allow_private_networks=policy.allow_private_networks,
        quotas=egress_convert.quotas_pb(policy.quotas),
        secrets=egress_convert.secrets_pb(policy.secrets),
        refuse_misdirected_secrets=policy.refuse_misdirected_secrets,
    )


def create_input(req: session_pb2.CreateSessionRequest) -> CreateSessionInput:
    return CreateSessionInput(
        session_id=req.session_id,
        image=req.image,
        limits=limits_request(req.limits),
        shell=ShellPolicy(allow=tuple(req.shell.allow), allow_all=req.shell.allow_all),
        network=network_policy(req.network),
        env=dict(req.env),
        labels=dict(req.labels),
        lease_ttl_s=optional_duration_s(req.lease_ttl, req.HasField("lease_ttl")),
        user=req.user,
        manifest=WorkspaceManifest(
            id=req.workspace.id,
            files=tuple(ManifestFile(f.path, f.content, f.mode) for f in req.workspace.files),
            directories=tuple(req.workspace.directories),
        ),
        from_snapshot_id=req.from_snapshot_id,
        isolation=isolation_from_pb(req.isolation),
        template=req.template,
        pull_policy=image_convert.pull_policy(req.pull_policy),
        volumes=tuple(
            VolumeMount(volume_id=m.volume_id, path=m.path, read_only=m.read_only)
            for m in req.volumes
        ),
        storage=storage_from_pb(req.workspace.storage),
        size_bytes=req.workspace.size_bytes,
    )


_STORAGE_PB = {
    WorkspaceStorage.MEMORY: session_pb2.WORKSPACE_STORAGE_MEMORY,
    WorkspaceStorage.DISK: session_pb2.WORKSPACE_STORAGE_DISK,
}
_STORAGE_IN: dict[int, WorkspaceStorage] = {v: k for k, v in _STORAGE_PB.items()}


def storage_from_pb(value: session_pb2.WorkspaceStorage.ValueType) -> WorkspaceStorage | None:
    """None: UNSPECIFIED (the operator's default); a value this server does not know is refused."""
    return _from_pb(
        value,
        session_pb2.WORKSPACE_STORAGE_UNSPECIFIED,
        _STORAGE_IN,
        "workspace.storage {value} is not a WorkspaceStorage this server knows",
        field="workspace.storage",
    )


def session_pb(s: Session) -> session_pb2.Session:
    return session_pb2.Session(
        session_id=s.session_id,
        state=_STATE[s.state],
        image=s.spec.image,
        fingerprint=s.fingerprint,
        created_at=datetime_pb(s.created_at),
        lease_expires_at=datetime_pb(s.lease_expires_at),
        limits=limits_pb(s.spec.limits),
        network=network_pb(s.spec.network),
        labels=s.labels,
        assurance=common_pb2.ASSURANCE_ENFORCED,
        shell=common_pb2.ShellPolicy(
            allow=list(s.spec.shell.allow), allow_all=s.spec.shell.allow_all
        ),
        user=s.spec.user,
        workspace_id=s.spec.manifest.id,
        state_reason=_state_reason_pb(s),
        isolation=ISOLATION_PB[s.spec.isolation],
        template=s.spec.template,
        image_digest=s.spec.image_digest,
        volumes=[
            volumes_pb2.VolumeMount(volume_id=m.volume_id, path=m.path, read_only=m.read_only)
            for m in s.spec.volumes
        ],
        workspace_storage=_STORAGE_PB[s.spec.storage],
        workspace_size_bytes=s.spec.limits.workspace_bytes,
        suspend_mode=SUSPEND_MODE_PB[s.suspend_mode],
        **_loss_fields(s.loss),
    )


# What a suspension kept; NONE (not suspended) is UNSPECIFIED.
SUSPEND_MODE_PB = {
    SuspendMode.NONE: session_pb2.SUSPEND_MODE_UNSPECIFIED,
    SuspendMode.FILESYSTEM: session_pb2.SUSPEND_MODE_FILESYSTEM,
    SuspendMode.MEMORY: session_pb2.SUSPEND_MODE_MEMORY,
}


def suspend_mode(value: int) -> SuspendMode:
    """A SuspendSessionRequest's mode: UNSPECIFIED is the filesystem suspend of old."""
    if value == session_pb2.SUSPEND_MODE_MEMORY:
        return SuspendMode.MEMORY
    return SuspendMode.FILESYSTEM


def _loss_fields(loss: Loss | None) -> dict[str, Any]:
    """Session.lost_time, restored_from, restored_state_time, lost_message."""
    if loss is None:
        return {}
    fields: dict[str, Any] = {
        "lost_time": datetime_pb(loss.lost_at),
        "lost_message": loss.message(),
    }
    if loss.snapshot_id and loss.restored_at is not None and loss.snapshot_at is not None:
        state_at = datetime_pb(loss.snapshot_at)
        fields |= {"restored_from": loss.snapshot_id, "restored_state_time": state_at}
    return fields


def _state_reason_pb(s: Session) -> session_pb2.SessionStateReason | None:
    why = state_reason(s)
    if why is None:
        return None
    return session_pb2.SessionStateReason(
        reason=why.reason, message=why.message, recoverable=why.recoverable
    )


def signal_name(name: str, value: int) -> str:
    """A request's signal: the enum when set (it wins), else the v1 string."""
    if not value:
        return name
    try:
        return process_pb2.Signal.Name(value).removeprefix("SIGNAL_")  # type: ignore[arg-type]
    except ValueError:
        return f"signal number {value}"  # refused by validate_signal as INVALID_SIGNAL


def signal_value(name: str) -> process_pb2.Signal.ValueType:
    try:
        return (
            process_pb2.Signal.Value("SIGNAL_" + name) if name else process_pb2.SIGNAL_UNSPECIFIED
        )
    except ValueError:
        return process_pb2.SIGNAL_UNSPECIFIED


def exited_pb(e: ExecExited) -> process_pb2.ProcessExited:
    return process_pb2.ProcessExited(
        exit_code=e.exit_code,
        signal=e.signal,
        timed_out=e.timed_out,
        truncated=e.truncated,
        duration=duration_pb(e.duration_s),
        signal_value=signal_value(e.signal),
    )


def file_info_pb(info: FileInfo) -> filesystem_pb2.FileInfo:
    return filesystem_pb2.FileInfo(
        path=info.path,
        name=info.name,
        type=_FILE_TYPE[info.type],
        size=info.size,
        size_bytes=info.size,
        mode=info.mode,
        modified_at=timestamp_pb(info.modified_ns),
        symlink_target=info.symlink_target,
    )


def file_event_pb(event: FileEvent) -> filesystem_pb2.FileEvent:
    return filesystem_pb2.FileEvent(
        sequence=event.sequence,
        kind=watch_pb2.FileEventKind.Value(f"FILE_EVENT_KIND_{event.kind.name}"),
        path=event.path,
        old_path=event.old_path,
        type=(
            _FILE_TYPE[event.type]
            if event.type is not None
            else filesystem_pb2.FILE_TYPE_UNSPECIFIED
        ),
    )
