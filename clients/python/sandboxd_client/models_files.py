"""What the workspace's calls answer, as `sandboxd_client.models` spells it: a file's metadata
(FileInfo), what an archive import wrote (ArchiveImported) and a stored snapshot (SnapshotInfo).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Self

from sandboxd_client._convert import enum_name, timestamp
from sandboxd_client._lazy import lazy

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import filesystem_pb2, snapshot_pb2
else:  # loaded on first use (sandboxd_client._lazy)
    filesystem_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.filesystem_pb2")
    snapshot_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.snapshot_pb2")


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
