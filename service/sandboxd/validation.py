"""Pure validation of caller input: paths, argv, env, user, ids, labels, file modes.

Everything a request carries passes through here before it reaches Docker, so each rule in
SECURITY.md that can be checked on the text alone is checked once, in one place. Functions
return a normalised copy or raise `InvalidArgument` / `PermissionDenied` with a stable
`reason` and a message a person can act on. No I/O: the in-container real-path checks
(symlinks) happen later, in the engine layer.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection, Mapping, Sequence

from sandboxd.errors import InvalidArgument, PermissionDenied
from sandboxd.reasons import Reason

__all__ = [
    "ALLOWED_BIN_DIRS",
    "DEFAULT_GID",
    "DEFAULT_UID",
    "ENV_KEY_RE",
    "LABEL_KEY_RE",
    "MAX_ARGS",
    "MAX_ARGV_TOTAL_BYTES",
    "MAX_ARG_BYTES",
    "MAX_ENV_ENTRIES",
    "MAX_ENV_KEY_BYTES",
    "MAX_ENV_VALUE_BYTES",
    "MAX_LABELS",
    "MAX_LABEL_VALUE_BYTES",
    "MAX_PATH_BYTES",
    "MAX_PATH_COMPONENT_BYTES",
    "LOADER_ENV_KEYS",
    "LOADER_ENV_PREFIX",
    "MAX_DURATION_S",
    "RESERVED_ENV_KEYS",
    "SESSION_ID_RE",
    "WORKSPACE",
    "check_command_allowed",
    "command_name",
    "duration_seconds",
    "parse_user",
    "validate_argv",
    "validate_cwd",
    "validate_env",
    "validate_file_mode",
    "validate_labels",
    "validate_process_id",
    "validate_session_id",
    "workspace_abspath",
    "workspace_relpath",
]

# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------

_SHOW_LIMIT = 80


def _show(value: str) -> str:
    """Quote a caller value for a message, cut short so errors stay small."""
    if len(value) <= _SHOW_LIMIT:
        return repr(value)
    return repr(value[:_SHOW_LIMIT]) + "..."


def _utf8_len(value: str) -> int | None:
    """Byte length on the wire; None for text that is not encodable (lone surrogates)."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _has_control(value: str) -> bool:
    """True for control, invisible-format or line-separator characters.

    They make names ambiguous in logs and messages (bidi overrides, zero-width joiners) and
    never belong in a command name or label value.
    """
    return any(unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp") for ch in value)


# --------------------------------------------------------------------------------------------
# Workspace paths
# --------------------------------------------------------------------------------------------

WORKSPACE = "/workspace"
MAX_PATH_BYTES = 4096
MAX_PATH_COMPONENT_BYTES = 255  # NAME_MAX on Linux

_WORKSPACE_NAME = WORKSPACE.lstrip("/")


def _path_error(path: str, message: str, reason: str) -> InvalidArgument:
    return InvalidArgument(message, reason=reason, metadata={"path": _show(path)})


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


# --------------------------------------------------------------------------------------------
# argv and the shell policy
# --------------------------------------------------------------------------------------------

ALLOWED_BIN_DIRS = ("/bin", "/usr/bin", "/usr/local/bin")
MAX_ARGS = 1024
MAX_ARG_BYTES = 65536
MAX_ARGV_TOTAL_BYTES = 262144  # sum of the UTF-8 lengths of all arguments
_BIN_DIRS_TEXT = ", ".join(ALLOWED_BIN_DIRS[:-1]) + " or " + ALLOWED_BIN_DIRS[-1]


def _argv_error(message: str, **metadata: str) -> InvalidArgument:
    return InvalidArgument(message, reason=Reason.INVALID_ARGV, metadata=metadata)


def _check_argv0(argv0: str) -> None:
    """argv[0] is a bare name or a path directly in a system bin dir, nothing else.

    The allowlist matches on the base name, so a path anywhere else (a writable /tmp, the
    workspace) would let a caller run its own binary under an allowed name.
    """
    shown = _show(argv0)
    if argv0 == "":
        raise _argv_error("argv[0] (the command) must not be empty")
    if argv0.strip() == "":
        raise _argv_error(f"argv[0] {shown} is only whitespace; give a command name")
    if _has_control(argv0):
        raise _argv_error(f"argv[0] {shown} contains control characters", argv0=shown)
    if argv0.startswith("-"):
        # Would be read as an option by `timeout` or `env` in front of the command.
        raise _argv_error(f"argv[0] {shown} must not start with '-'", argv0=shown)
    if ".." in argv0.split("/") or argv0 == ".":
        raise _argv_error(f"argv[0] {shown} must not contain '..' or be '.'", argv0=shown)
    if "/" in argv0:
        directory, _, base = argv0.rpartition("/")
        if directory not in ALLOWED_BIN_DIRS or base in ("", "."):
            raise _argv_error(
                f"argv[0] {shown} is not allowed: give a bare command name or an absolute "
                f"path directly in {_BIN_DIRS_TEXT}",
                argv0=shown,
            )


def validate_argv(argv: Sequence[str]) -> list[str]:
    """Check an argv against SECURITY.md's exec rules and return a list copy.

    Sizes are bounded here so an oversized request fails clearly instead of as E2BIG from
    the engine.
    """
    if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence):
        # A bare string is a Sequence[str] too: "ls -l" would become ["l", "s", ...].
        raise _argv_error("argv must be a list of strings, not a single string")
    if len(argv) == 0:
        raise _argv_error("argv must not be empty; argv[0] is the command to run")
    if len(argv) > MAX_ARGS:
        raise _argv_error(f"argv has {len(argv)} arguments; the limit is {MAX_ARGS}")
    total = 0
    for index, arg in enumerate(argv):
        if not isinstance(arg, str):
            raise _argv_error(f"argv[{index}] is not a string", index=str(index))
        if "\x00" in arg:
            raise _argv_error(f"argv[{index}] contains a NUL byte", index=str(index))
        size = _utf8_len(arg)
        if size is None:
            raise _argv_error(f"argv[{index}] is not valid UTF-8 text", index=str(index))
        if size > MAX_ARG_BYTES:
            raise _argv_error(
                f"argv[{index}] is {size} bytes long; the limit is {MAX_ARG_BYTES}",
                index=str(index),
            )
        total += size
        if total > MAX_ARGV_TOTAL_BYTES:
            raise _argv_error(
                f"argv is longer than {MAX_ARGV_TOTAL_BYTES} bytes in total", index=str(index)
            )
    _check_argv0(argv[0])
    return list(argv)


def command_name(argv0: str) -> str:
    """The name the shell allowlist matches: the basename of argv[0]."""
    return argv0.rpartition("/")[2]


def check_command_allowed(argv0: str, allow: Collection[str], allow_all: bool) -> None:
    """Refuse a command the session's ShellPolicy does not list (deny by default)."""
    if allow_all:
        return
    name = command_name(argv0)
    if name in allow:
        return
    shown = _show(name)
    if len(allow) == 0:
        message = (
            f"command {shown} is not allowed: every command is denied until the session "
            "declares an allowlist (ShellPolicy.allow) or sets ShellPolicy.allow_all"
        )
    else:
        message = (
            f"command {shown} is not in this session's allowlist; add {shown} to "
            "ShellPolicy.allow or set ShellPolicy.allow_all"
        )
    raise PermissionDenied(message, reason=Reason.COMMAND_NOT_ALLOWED, metadata={"command": shown})


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------

# \A...\Z rather than ^...$: "$" also matches before a trailing newline.
ENV_KEY_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_ENV_ENTRIES = 256
MAX_ENV_KEY_BYTES = 256
MAX_ENV_VALUE_BYTES = 32768
RESERVED_ENV_KEYS = frozenset(
    {
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "NO_PROXY",
        "no_proxy",
        "ALL_PROXY",
        "all_proxy",
    }
)
# Some clients (Python's urllib) lower-case every *_proxy name, so "Http_Proxy" would
# override the server's value too: compare case-insensitively.
_RESERVED_ENV_KEYS_FOLDED = frozenset(k.lower() for k in RESERVED_ENV_KEYS)

# Variables the dynamic loader and libc read in every program, whatever the program: with them
# an allowlisted `ls` would load a library, a gconv module or a locale the caller uploaded, and
# run the caller's code (SECURITY.md, "the allowlist names the program that runs"). glibc's
# own list of variables it drops for set-id programs (unsecvars.h), minus TMPDIR, plus every
# `LD_` name (musl and future loaders). Program-specific ones (TAR_OPTIONS, PYTHONPATH) are
# not here: a program's arguments can do as much as its own variables. The helper removes
# the same names before every exec (helper/README.md), so a stored session that predates
# this rule cannot pass them either.
LOADER_ENV_PREFIX = "LD_"
LOADER_ENV_KEYS = frozenset(
    {
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "MALLOC_TRACE",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TZDIR",
    }
)


def _is_loader_key(key: str) -> bool:
    return key.startswith(LOADER_ENV_PREFIX) or key in LOADER_ENV_KEYS


def _env_error(message: str, key: str, reason: str = Reason.INVALID_ENV) -> InvalidArgument:
    return InvalidArgument(message, reason=reason, metadata={"key": _show(key)})


def validate_env(env: Mapping[str, str]) -> dict[str, str]:
    """Check caller environment variables and return a dict copy.

    The proxy variables are set by the server for the egress allowlist and cannot be
    overridden; the loader variables would let a caller run its own code inside any
    allowlisted program, so they are refused for every session.
    """
    if len(env) > MAX_ENV_ENTRIES:
        raise InvalidArgument(
            f"env has {len(env)} entries; the limit is {MAX_ENV_ENTRIES}", reason=Reason.INVALID_ENV
        )
    result: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_KEY_RE.match(key):
            shown = _show(key) if isinstance(key, str) else "<non-string>"
            raise InvalidArgument(
                f"env key {shown} is invalid: keys match [A-Za-z_][A-Za-z0-9_]*",
                reason=Reason.INVALID_ENV,
                metadata={"key": shown},
            )
        if len(key) > MAX_ENV_KEY_BYTES:  # ASCII by the pattern, so chars == bytes
            raise _env_error(
                f"env key {_show(key)} is {len(key)} bytes long; the limit is {MAX_ENV_KEY_BYTES}",
                key,
            )
        if key.lower() in _RESERVED_ENV_KEYS_FOLDED:
            raise _env_error(
                f"env key {_show(key)} is reserved: the server sets the proxy variables "
                "for the egress allowlist and they cannot be overridden",
                key,
                Reason.ENV_RESERVED,
            )
        if _is_loader_key(key):
            raise _env_error(
                f"env key {_show(key)} is reserved: dynamic-loader and libc variables "
                f"({LOADER_ENV_PREFIX}*, {', '.join(sorted(LOADER_ENV_KEYS))}) would load "
                "caller files into allowlisted programs and cannot be set",
                key,
                Reason.ENV_RESERVED,
            )
        if not isinstance(value, str):
            raise _env_error(f"env value of {_show(key)} is not a string", key)
        if "\x00" in value:
            raise _env_error(f"env value of {_show(key)} contains a NUL byte", key)
        size = _utf8_len(value)
        if size is None:
            raise _env_error(f"env value of {_show(key)} is not valid UTF-8 text", key)
        if size > MAX_ENV_VALUE_BYTES:
            raise _env_error(
                f"env value of {_show(key)} is {size} bytes long; "
                f"the limit is {MAX_ENV_VALUE_BYTES}",
                key,
            )
        result[key] = value
    return result


# --------------------------------------------------------------------------------------------
# User
# --------------------------------------------------------------------------------------------

DEFAULT_UID = 65534
DEFAULT_GID = 65534
_MAX_ID = 2**31 - 1
_USER_RE = re.compile(r"\A([0-9]{1,10}):([0-9]{1,10})\Z")


def parse_user(user: str) -> tuple[int, int]:
    """Parse the numeric `uid:gid` a session runs as; "" means nobody (65534:65534).

    Only numbers: names would be resolved inside an image the caller may choose, and root
    (uid 0 or gid 0) is refused whatever the spelling.
    """
    if user == "":
        return DEFAULT_UID, DEFAULT_GID
    shown = _show(user)
    match = _USER_RE.match(user)
    if match is None:
        parts = [part.strip().lower() for part in user.split(":")]
        if any(part == "root" or (part != "" and set(part) == {"0"}) for part in parts):
            message = (
                f"user {shown} is refused: running as root is not allowed; "
                "give a numeric non-root 'uid:gid' such as '65534:65534'"
            )
        elif len(parts) == 1 and parts[0].isdecimal():
            message = (
                f"user {shown} is invalid: give the gid too, as a numeric 'uid:gid' "
                "such as '65534:65534'"
            )
        else:
            message = (
                f"user {shown} is invalid: a numeric 'uid:gid' is required "
                "(names are not resolved), such as '65534:65534'"
            )
        raise InvalidArgument(message, reason=Reason.INVALID_USER, metadata={"user": shown})
    uid, gid = int(match.group(1)), int(match.group(2))
    if uid == 0 or gid == 0:
        raise InvalidArgument(
            f"user {shown} is refused: root (uid 0 or gid 0) is not allowed; "
            "give a numeric non-root 'uid:gid' such as '65534:65534'",
            reason=Reason.INVALID_USER,
            metadata={"user": shown},
        )
    if uid > _MAX_ID or gid > _MAX_ID:
        raise InvalidArgument(
            f"user {shown} is invalid: uid and gid must be at most {_MAX_ID}",
            reason=Reason.INVALID_USER,
            metadata={"user": shown},
        )
    return uid, gid


# --------------------------------------------------------------------------------------------
# Ids and labels
# --------------------------------------------------------------------------------------------

# Safe inside Docker object names and label values; \A...\Z so a trailing newline fails.
SESSION_ID_RE = re.compile(r"\A[a-z0-9][a-z0-9_.-]{0,62}\Z")
_ID_RULE = "1-63 characters of a-z, 0-9, '_', '.', '-', starting with a letter or digit"


def _validate_id(value: str, what: str, reason: str) -> str:
    if not isinstance(value, str) or not SESSION_ID_RE.match(value):
        shown = _show(value) if isinstance(value, str) else "<non-string>"
        raise InvalidArgument(
            f"{what} {shown} is invalid: use {_ID_RULE}",
            reason=reason,
            metadata={what.replace(" ", "_"): shown},
        )
    return value


def validate_session_id(session_id: str) -> str:
    """A caller-chosen session id; it ends up in container and network names."""
    return _validate_id(session_id, "session id", Reason.INVALID_SESSION_ID)


def validate_process_id(process_id: str) -> str:
    """A caller-chosen process id, held to the same rule as session ids."""
    return _validate_id(process_id, "process id", Reason.INVALID_PROCESS_ID)


MAX_LABELS = 64
MAX_LABEL_VALUE_BYTES = 256
# Docker/Kubernetes-like keys: alphanumeric ends, '_', '.', '-', '/' inside, at most 128.
LABEL_KEY_RE = re.compile(r"\A[A-Za-z0-9]([A-Za-z0-9_.\-/]{0,126}[A-Za-z0-9])?\Z")


def validate_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Check caller labels (used for selectors and stored on resources); return a copy."""
    if len(labels) > MAX_LABELS:
        raise InvalidArgument(
            f"{len(labels)} labels given; the limit is {MAX_LABELS}", reason=Reason.INVALID_LABELS
        )
    result: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY_RE.match(key):
            shown = _show(key) if isinstance(key, str) else "<non-string>"
            raise InvalidArgument(
                f"label key {shown} is invalid: 1-128 characters of letters, digits, "
                "'_', '.', '-', '/', starting and ending with a letter or digit",
                reason=Reason.INVALID_LABELS,
                metadata={"key": shown},
            )
        if not isinstance(value, str):
            raise InvalidArgument(
                f"label {_show(key)} has a non-string value",
                reason=Reason.INVALID_LABELS,
                metadata={"key": _show(key)},
            )
        size = _utf8_len(value)
        if size is None or _has_control(value):
            raise InvalidArgument(
                f"label {_show(key)} has a value with NUL or control characters",
                reason=Reason.INVALID_LABELS,
                metadata={"key": _show(key)},
            )
        if size > MAX_LABEL_VALUE_BYTES:
            raise InvalidArgument(
                f"label {_show(key)} has a value of {size} bytes; "
                f"the limit is {MAX_LABEL_VALUE_BYTES}",
                reason=Reason.INVALID_LABELS,
                metadata={"key": _show(key)},
            )
        result[key] = value
    return result


# --------------------------------------------------------------------------------------------
# File modes
# --------------------------------------------------------------------------------------------

_MAX_MODE = 0o7777
_PERMISSION_BITS = 0o777


def validate_file_mode(mode: int, *, default: int) -> int:
    """Permission bits for a file the API writes; 0 (unset in proto3) means `default`.

    setuid, setgid and sticky bits are stripped: a sandbox user must not be able to create
    set-id files (SECURITY.md).
    """
    if isinstance(mode, bool) or not isinstance(mode, int):
        raise InvalidArgument("file mode must be an integer", reason=Reason.INVALID_MODE)
    if mode == 0:
        return default
    if mode < 0 or mode > _MAX_MODE:
        raise InvalidArgument(
            f"file mode {oct(mode)} is out of range: give permission bits between 0 and 0o7777 "
            "(e.g. 0o644)",
            reason=Reason.INVALID_MODE,
            metadata={"mode": str(mode)},
        )
    return mode & _PERMISSION_BITS


# --------------------------------------------------------------------------------------------
# Image references
# --------------------------------------------------------------------------------------------

# Docker's reference grammar (distribution/reference): [host[:port]/]path[:tag][@digest], or
# an image id. A name the engine would refuse is the caller's mistake, not an internal error.
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_HOST_PART = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_IMAGE_HOST = rf"(?:{_IMAGE_HOST_PART}(?:\.{_IMAGE_HOST_PART})*(?::[0-9]+)?/)?"
_IMAGE_TAG = r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
_IMAGE_DIGEST = r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
IMAGE_REF_RE = re.compile(
    rf"\A(?:sha256:[0-9a-f]{{64}}"
    rf"|{_IMAGE_HOST}{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*{_IMAGE_TAG}{_IMAGE_DIGEST})\Z"
)
MAX_IMAGE_REF = 512


def validate_image(image: str) -> str:
    """An image reference the engine can look up, such as `alpine:3.21` or `sha256:<id>`."""
    if len(image) > MAX_IMAGE_REF or not IMAGE_REF_RE.match(image):
        raise InvalidArgument(
            f"image {_show(image)} is not a valid image reference (e.g. alpine:3.21, "
            "registry.example.com:5000/team/tool:1.0, name@sha256:<digest>; lowercase name)",
            reason=Reason.INVALID_IMAGE,
            metadata={"image": _show(image)},
        )
    return image


# --------------------------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------------------------

# google.protobuf.Duration's own range: about +-10,000 years, nanos of the same sign.
MAX_DURATION_S = 315_576_000_000
_MAX_NANOS = 999_999_999


def duration_seconds(seconds: int, nanos: int) -> float:
    """Seconds of a wire Duration; a malformed one is the caller's mistake, never a value.

    protobuf defines a Duration only within +-315,576,000,000 s, with |nanos| below 10^9 and
    of the sign of `seconds`; a hand-built message can carry anything else, which would be
    read as some other duration (1 s and -1 ns as 0.999999999 s). Whether the value suits the
    field (positive, under a maximum) is the field's own check.
    """
    if (
        abs(seconds) > MAX_DURATION_S
        or abs(nanos) > _MAX_NANOS
        or (seconds > 0 > nanos)
        or (seconds < 0 < nanos)
    ):
        raise InvalidArgument(
            f"duration {{seconds: {seconds}, nanos: {nanos}}} is not a valid "
            f"google.protobuf.Duration (|seconds| <= {MAX_DURATION_S}, |nanos| <= {_MAX_NANOS}, "
            "both of one sign)",
            reason=Reason.INVALID_ARGUMENT,
        )
    return seconds + nanos / 1e9
