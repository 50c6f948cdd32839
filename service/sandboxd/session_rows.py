"""How a session record is spelled in its SQLite row, and read back.

The spec, the suspension (its mode and the memory suspends it came back from) and what a
dead sandbox lost are JSON columns; times are POSIX seconds. Pure: the store
(`sandboxd.store`) owns the table, its steps, the cache and the queries; this module only
turns one record into its columns and one row into a record. Every field added to the spec
is read with a default, so a row written by an older release still opens.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import aiosqlite

from sandboxd.isolation import Isolation
from sandboxd.models import (
    Limits,
    Loss,
    ManifestFile,
    NetworkMode,
    NetworkPolicy,
    ProxyQuotas,
    SecretBinding,
    Session,
    SessionSpec,
    SessionState,
    ShellPolicy,
    SuspendMode,
    VolumeMount,
    WorkspaceManifest,
    WorkspaceStorage,
)

__all__ = [
    "MAX_PAUSES",
    "from_stamp",
    "loss_from_json",
    "loss_to_json",
    "row_to_session",
    "spec_from_json",
    "spec_to_json",
    "suspension_to_json",
    "to_stamp",
]


def spec_to_json(spec: SessionSpec) -> str:
    return json.dumps(
        {
            "image": spec.image,
            "image_digest": spec.image_digest,
            "image_id": spec.image_id,
            "limits": spec.limits.to_dict(),
            "shell": {"allow": list(spec.shell.allow), "allow_all": spec.shell.allow_all},
            "network": {
                "mode": spec.network.mode.value,
                "allowed_domains": list(spec.network.allowed_domains),
                "allowed_ports": list(spec.network.allowed_ports),
                "allow_private_networks": spec.network.allow_private_networks,
                "quotas": spec.network.quotas.to_dict(),
                # Never a plaintext value: the sealed bytes, useless without the key.
                "secrets": [
                    {**b.public(), "sealed": base64.b64encode(b.sealed).decode()}
                    for b in spec.network.secrets
                ],
                "refuse_misdirected_secrets": spec.network.refuse_misdirected_secrets,
            },
            "env": spec.env,
            "uid": spec.uid,
            "gid": spec.gid,
            "requested_user": spec.requested_user,
            "isolation": spec.isolation.value,
            "template": spec.template,
            "volumes": [
                {"volume_id": v.volume_id, "path": v.path, "read_only": v.read_only, "disk": v.disk}
                for v in spec.volumes
            ],
            "storage": spec.storage.value,
            "disk_id": spec.disk_id,
            "manifest": {
                "id": spec.manifest.id,
                "files": [
                    {
                        "path": f.path,
                        "mode": f.mode,
                        "content": base64.b64encode(f.content).decode(),
                    }
                    for f in spec.manifest.files
                ],
                "directories": list(spec.manifest.directories),
            },
        }
    )


def _binding(d: dict[str, Any]) -> SecretBinding:
    return SecretBinding(
        name=d["name"],
        hosts=tuple(d["hosts"]),
        header=d["header"],
        template=d["template"],
        secret_ref=d["secret_ref"],
        placeholder=d["placeholder"],
        sealed=base64.b64decode(d["sealed"]),
    )


def spec_from_json(text: str) -> SessionSpec:
    d: dict[str, Any] = json.loads(text)
    m = d["manifest"]
    return SessionSpec(
        image=d["image"],
        image_digest=d.get("image_digest", ""),
        image_id=d.get("image_id", ""),
        limits=Limits.from_dict(d["limits"]),
        shell=ShellPolicy(allow=tuple(d["shell"]["allow"]), allow_all=d["shell"]["allow_all"]),
        network=NetworkPolicy(
            mode=NetworkMode(d["network"]["mode"]),
            allowed_domains=tuple(d["network"]["allowed_domains"]),
            allowed_ports=tuple(d["network"]["allowed_ports"]),
            allow_private_networks=d["network"]["allow_private_networks"],
            quotas=ProxyQuotas(**d["network"].get("quotas", {})),
            secrets=tuple(_binding(b) for b in d["network"].get("secrets", [])),
            refuse_misdirected_secrets=d["network"].get("refuse_misdirected_secrets", False),
        ),
        env=dict(d["env"]),
        uid=d["uid"],
        gid=d["gid"],
        requested_user=d.get("requested_user", ""),
        manifest=WorkspaceManifest(
            id=m["id"],
            files=tuple(
                ManifestFile(path=f["path"], mode=f["mode"], content=base64.b64decode(f["content"]))
                for f in m["files"]
            ),
            directories=tuple(m["directories"]),
        ),
        isolation=Isolation(d.get("isolation", Isolation.RUNC.value)),
        template=d.get("template", ""),
        volumes=tuple(VolumeMount(**v) for v in d.get("volumes", [])),
        storage=WorkspaceStorage(d.get("storage", WorkspaceStorage.MEMORY.value)),
        disk_id=d.get("disk_id", ""),
    )


def to_stamp(value: datetime) -> float:
    return value.timestamp()


def from_stamp(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC)


MAX_PAUSES = 1000  # kept per session (16 bytes each in memory); the oldest go first


def suspension_to_json(s: Session) -> str:
    if s.suspend_mode is SuspendMode.NONE and not s.pauses:
        return ""
    pauses = [list(p) for p in s.pauses[-MAX_PAUSES:]]
    return json.dumps({"mode": s.suspend_mode.value, "pauses": pauses})


def _suspension_from_json(text: str) -> dict[str, Any]:
    if not text:
        return {}
    data = json.loads(text)
    pauses = tuple((float(a), float(b)) for a, b in data.get("pauses") or ())
    return {"suspend_mode": SuspendMode(data.get("mode", "")), "pauses": pauses}


def loss_to_json(loss: Loss | None) -> str:
    if loss is None:
        return ""
    return json.dumps(
        {
            "lost_at": to_stamp(loss.lost_at),
            "snapshot_id": loss.snapshot_id,
            "snapshot_at": to_stamp(loss.snapshot_at) if loss.snapshot_at else None,
            "restored_at": to_stamp(loss.restored_at) if loss.restored_at else None,
        }
    )


def loss_from_json(text: str) -> Loss | None:
    if not text:
        return None
    d = json.loads(text)
    return Loss(
        lost_at=from_stamp(d["lost_at"]),
        snapshot_id=d.get("snapshot_id") or "",
        snapshot_at=from_stamp(d["snapshot_at"]) if d.get("snapshot_at") is not None else None,
        restored_at=from_stamp(d["restored_at"]) if d.get("restored_at") is not None else None,
    )


def row_to_session(row: aiosqlite.Row) -> Session:
    return Session(
        session_id=row["session_id"],
        fingerprint=row["fingerprint"],
        state=SessionState(row["state"]),
        created_at=from_stamp(row["created_at"]),
        lease_expires_at=from_stamp(row["lease_expires_at"]),
        container_id=row["container_id"],
        labels=json.loads(row["labels"]),
        spec=spec_from_json(row["spec"]),
        tenant=row["tenant"],
        loss=loss_from_json(row["loss"]),
        **_suspension_from_json(row["suspension"]),
    )
