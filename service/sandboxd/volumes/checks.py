"""What a volume request may say, checked on its text alone (no store, no engine).

Mount paths are held to a narrow alphabet so that nothing the engine or the kernel would read
differently from the server gets through: every component is 1-64 of `A-Z a-z 0-9 . _ -`
(no `.` or `..`, no NUL, no control or non-ASCII character that could look like a slash or
another name), the path is absolute and already normal (no `//`, no trailing `/`), and it lies
strictly below /mnt, or directly below /workspace (`/workspace/NAME`: one folder, so the
workspace's tar paths leave a volume out by its name: snapshots, suspend, fork and the export
of the workspace root skip it, and a restore's replace spares its mount point; the image's
busybox tar has no --exclude to leave out a deeper one). Never /workspace itself, nor a name
of the server's import staging (`.sbx-`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sandboxd.errors import InvalidArgument
from sandboxd.models import VolumeMount
from sandboxd.reasons import Reason
from sandboxd.validation._text import _plain, _show
from sandboxd.validation.identity import SESSION_ID_RE, validate_id

MOUNT_ROOT = "/mnt"
WORKSPACE_ROOT = "/workspace"
MAX_DEPTH = 8  # components below /mnt
_STAGING = ".sbx-"  # the import's stage and trash (sandboxd.archive.transfer)
_COMPONENT_RE = re.compile(r"\A[A-Za-z0-9_.-]{1,64}\Z")


def validate_volume_id(volume_id: str) -> str:
    """A volume id: the session id alphabet (it is shown in listings and error metadata, never
    used as an engine name: the disk has a name of the server's own)."""
    return validate_id(volume_id, "volume id", Reason.INVALID_VOLUME_ID)


def is_volume_id(value: str) -> bool:
    return isinstance(value, str) and SESSION_ID_RE.match(value) is not None


MIN_SIZE_BYTES = 16 * 1024 * 1024  # ext4's journal and tables need room of their own


def check_size(size_bytes: int, default_bytes: int, max_bytes: int) -> int:
    """The size to make: the default for 0; negative, under 16 MiB or over the maximum is
    refused."""
    if size_bytes < 0 or (0 < size_bytes < MIN_SIZE_BYTES) or size_bytes > max_bytes:
        raise InvalidArgument(
            f"size_bytes {size_bytes} is invalid: give {MIN_SIZE_BYTES} to {max_bytes} "
            "(volume_max_bytes), or 0 for the server's default",
            reason=Reason.VOLUME_SIZE_INVALID,
            metadata={"size_bytes": str(size_bytes), "max_bytes": str(max_bytes)},
        )
    return size_bytes or min(default_bytes, max_bytes)


def _path_error(path: str, why: str) -> InvalidArgument:
    return InvalidArgument(
        f"mount path {_show(path)} is invalid: {why}",
        reason=Reason.MOUNT_PATH_INVALID,
        metadata={"path": _plain(path)},
    )


def check_mount_path(path: str) -> str:
    """An absolute, normal path of plain components strictly below /mnt, or one folder
    directly below /workspace."""
    rule = "below /mnt or directly below /workspace, such as /mnt/data or /workspace/data"
    if not isinstance(path, str) or not path:
        raise _path_error(str(path), f"give an absolute path {rule}")
    if not path.startswith("/"):
        raise _path_error(path, f"it must be absolute, {rule}")
    parts = path.split("/")[1:]
    root = "/" + parts[0]
    if root not in (MOUNT_ROOT, WORKSPACE_ROOT):
        raise _path_error(path, f"volumes mount {rule}")
    below = parts[1:]
    if not below or below == [""]:
        raise _path_error(path, f"it must name a folder below {root}, not {root} itself")
    if len(below) > MAX_DEPTH:
        raise _path_error(path, f"at most {MAX_DEPTH} folders below /mnt")
    for part in below:
        if part in ("", ".", ".."):
            raise _path_error(path, "it must be normal: no empty, '.' or '..' component")
        if not _COMPONENT_RE.match(part):
            raise _path_error(path, "each folder name is 1-64 of A-Z, a-z, 0-9, '.', '_', '-'")
    if root == WORKSPACE_ROOT:
        if len(below) > 1:
            raise _path_error(
                path,
                "a volume in the workspace is one folder directly below /workspace (such as "
                "/workspace/data): the workspace's snapshots leave it out by its name",
            )
        if below[0].startswith(_STAGING):
            raise _path_error(path, f"names starting {_STAGING!r} are the server's own")
    return path


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def check_mounts(mounts: Sequence[VolumeMount], max_mounts: int) -> tuple[VolumeMount, ...]:
    """A create request's volumes: each id and path valid, each volume once, no path at,
    above or below another's (Docker would stack one over the other)."""
    if len(mounts) > max_mounts:
        raise InvalidArgument(
            f"{len(mounts)} volumes asked; a session mounts at most {max_mounts} "
            "(volume_mounts_per_session)",
            reason=Reason.MOUNT_PATH_INVALID,
            metadata={"limit": str(max_mounts)},
        )
    checked: list[VolumeMount] = []
    for m in mounts:
        validate_volume_id(m.volume_id)
        path = check_mount_path(m.path)
        for other in checked:
            if other.volume_id == m.volume_id:
                raise _path_error(
                    path, f"volume {m.volume_id!r} is already mounted at {other.path}"
                )
            if _overlaps(path, other.path):
                raise _path_error(path, f"it overlaps the mount at {other.path}")
        checked.append(VolumeMount(volume_id=m.volume_id, path=path, read_only=m.read_only))
    return tuple(checked)
