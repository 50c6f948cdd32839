"""A fork's workspace from a disk snapshot: a disk of the snapshot's size, made as its copy.

A tar snapshot restores into either kind of workspace (the checked import). A disk snapshot
(storage/disk_snapshots.py) is a disk: the fork's workspace is a copy of it made on the engine
host, so the fork is a disk workspace of the snapshot's size whatever the operator's default
storage; a memory workspace or another size asked explicitly is refused before anything is
made (the caller takes a TAR snapshot for those).
"""

from __future__ import annotations

import dataclasses
import secrets

from sandboxd.errors import InvalidArgument
from sandboxd.models import WORKSPACE_DISK_PREFIX, SessionSpec, WorkspaceStorage
from sandboxd.reasons import Reason
from sandboxd.sessions.spec import CreateSessionInput
from sandboxd.snapshot_store import KIND_DISK, Snapshot


def fit_to_source(
    spec: SessionSpec, req: CreateSessionInput, source: Snapshot | None
) -> SessionSpec:
    """The spec of a fork from `source`: unchanged unless it is a disk snapshot."""
    if source is None or source.kind != KIND_DISK:
        return spec
    meta = {"limit": "workspace.size_bytes", "snapshot_id": source.snapshot_id}
    if req.storage is WorkspaceStorage.MEMORY:
        raise InvalidArgument(
            f"snapshot {source.snapshot_id} is a disk snapshot: it forks into a disk "
            "workspace (take a TAR snapshot for a memory one)",
            reason=Reason.LIMIT_INVALID,
            metadata=meta,
        )
    if req.size_bytes and req.size_bytes != source.disk_bytes:
        raise InvalidArgument(
            f"workspace.size_bytes = {req.size_bytes} differs from the size of the disk "
            f"snapshot {source.snapshot_id}, {source.disk_bytes}: leave it 0 for a fork",
            reason=Reason.LIMIT_INVALID,
            metadata={**meta, "snapshot_bytes": str(source.disk_bytes)},
        )
    limits = dataclasses.replace(spec.limits, workspace_bytes=source.disk_bytes)
    return dataclasses.replace(
        spec,
        storage=WorkspaceStorage.DISK,
        limits=limits,
        disk_id=spec.disk_id or WORKSPACE_DISK_PREFIX + secrets.token_hex(12),
    )


def disk_source(source: Snapshot | None) -> str:
    """The disk a fork's workspace is copied from ("" for a tar or no snapshot)."""
    return source.disk if source is not None and source.kind == KIND_DISK else ""
