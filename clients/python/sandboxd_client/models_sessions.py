"""A session as the server reports it (SessionInfo, with why it is in its state) and the egress
proxy's log of it (EgressEvent), as `sandboxd_client.models` spells them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Self

from sandboxd_client._convert import enum_name, seconds, timestamp
from sandboxd_client._lazy import lazy
from sandboxd_client.models_policies import NetworkPolicy, ResourceLimits, ShellPolicy
from sandboxd_client.volumes import VolumeMount

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import common_pb2, leases_pb2, session_pb2
else:  # loaded on first use (sandboxd_client._lazy)
    common_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.common_pb2")
    leases_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.leases_pb2")
    session_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.session_pb2")


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
