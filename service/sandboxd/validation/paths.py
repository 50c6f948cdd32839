"""Workspace paths: every path a caller gives is confined to /workspace as text first (the
helper then resolves it race-free inside the container)."""

from __future__ import annotations

from sandboxd.errors import InvalidArgument
from sandboxd.reasons import Reason
from sandboxd.validation._text import _plain, _show, _utf8_len

WORKSPACE = "/workspace"
MAX_PATH_BYTES = 4096
MAX_PATH_COMPONENT_BYTES = 255  # NAME_MAX on Linux

_WORKSPACE_NAME = WORKSPACE.lstrip("/")


def _path_error(path: str, message: str, reason: str) -> InvalidArgument:
    return InvalidArgument(message, reason=reason, metadata={"path": _plain(path)})


def workspace_relpath(path: str, *, allow_root: bool = True) -> str:
    """Normalise a caller path to one relative to /workspace, or raise.

    `..` is refused anywhere, even where it would stay inside: the text is resolved here
    without looking at the filesystem, so a `..` after a symlink could still climb out.
    Returns "." for the workspace root (when `allow_root`).
    """
    if not isinstance(path, str):
        raise InvalidArgument("path must be a string", reason=Reason.PATH_INVALID)
    if path == "":
        raise _path_error(path, "path must not be empty", Reason.PATH_INVALID)
    if "\x00" in path:
        raise _path_error(path, f"path {_show(path)} contains a NUL byte", Reason.PATH_INVALID)
    size = _utf8_len(path)
    if size is None:
        raise _path_error(path, f"path {_show(path)} is not valid UTF-8 text", Reason.PATH_INVALID)
    if size > MAX_PATH_BYTES:
        raise _path_error(
            path,
            f"path {_show(path)} is {size} bytes long; the limit is {MAX_PATH_BYTES}",
            Reason.PATH_INVALID,
        )

    # Empty and "." components carry no meaning ("a//b", "./a", "a/"); drop them.
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _path_error(
            path,
            f"path {_show(path)} contains a '..' component; "
            f"use a path relative to {WORKSPACE} without '..'",
            Reason.PATH_OUTSIDE_WORKSPACE,
        )
    if path.startswith("/"):
        if not parts or parts[0] != _WORKSPACE_NAME:
            raise _path_error(
                path, f"path {_show(path)} is outside {WORKSPACE}", Reason.PATH_OUTSIDE_WORKSPACE
            )
        parts = parts[1:]
    for part in parts:
        if len(part.encode("utf-8")) > MAX_PATH_COMPONENT_BYTES:
            raise _path_error(
                path,
                f"path {_show(path)} has a component longer than {MAX_PATH_COMPONENT_BYTES} bytes",
                Reason.PATH_INVALID,
            )
    if not parts:
        if not allow_root:
            raise _path_error(
                path,
                f"the workspace root itself cannot be used here; "
                f"name a file or directory inside {WORKSPACE}",
                Reason.PATH_INVALID,
            )
        return "."
    return "/".join(parts)


def workspace_abspath(path: str) -> str:
    """Absolute in-container form of a caller path: "/workspace" or "/workspace/<rel>"."""
    rel = workspace_relpath(path, allow_root=True)
    return WORKSPACE if rel == "." else f"{WORKSPACE}/{rel}"


def validate_cwd(cwd: str) -> str:
    """Working directory for a command; unset means the workspace root."""
    if cwd == "":
        return WORKSPACE
    return workspace_abspath(cwd)
