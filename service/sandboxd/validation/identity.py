"""Users, ids, labels, file modes and image references: the scalar fields of a request, each
normalised or refused with a stable reason (durations: durations.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from sandboxd.errors import InvalidArgument
from sandboxd.reasons import Reason
from sandboxd.validation._text import _has_control, _plain, _show, _utf8_len

# User

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
        raise InvalidArgument(message, reason=Reason.INVALID_USER, metadata={"user": _plain(user)})
    uid, gid = int(match.group(1)), int(match.group(2))
    if uid == 0 or gid == 0:
        raise InvalidArgument(
            f"user {shown} is refused: root (uid 0 or gid 0) is not allowed; "
            "give a numeric non-root 'uid:gid' such as '65534:65534'",
            reason=Reason.INVALID_USER,
            metadata={"user": _plain(user)},
        )
    if uid > _MAX_ID or gid > _MAX_ID:
        raise InvalidArgument(
            f"user {shown} is invalid: uid and gid must be at most {_MAX_ID}",
            reason=Reason.INVALID_USER,
            metadata={"user": _plain(user)},
        )
    return uid, gid


# Ids and labels

# Safe inside Docker object names and label values; \A...\Z so a trailing newline fails.
SESSION_ID_RE = re.compile(r"\A[a-z0-9][a-z0-9_.-]{0,62}\Z")
_ID_RULE = "1-63 characters of a-z, 0-9, '_', '.', '-', starting with a letter or digit"


def validate_id(value: str, what: str, reason: str) -> str:
    """An id of the session id alphabet (sessions, processes, volumes): one rule and one
    refusal for each, with the id's name (`what`) and its own reason."""
    if not isinstance(value, str) or not SESSION_ID_RE.match(value):
        raise InvalidArgument(
            f"{what} {_show(value)} is invalid: use {_ID_RULE}",
            reason=reason,
            metadata={what.replace(" ", "_"): _plain(value)},
        )
    return value


def validate_session_id(session_id: str) -> str:
    """A caller-chosen session id; it ends up in container and network names."""
    return validate_id(session_id, "session id", Reason.INVALID_SESSION_ID)


def validate_process_id(process_id: str) -> str:
    """A caller-chosen process id, held to the same rule as session ids."""
    return validate_id(process_id, "process id", Reason.INVALID_PROCESS_ID)


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
            raise InvalidArgument(
                f"label key {_show(key)} is invalid: 1-128 characters of letters, digits, "
                "'_', '.', '-', '/', starting and ending with a letter or digit",
                reason=Reason.INVALID_LABELS,
                metadata={"key": _plain(key)},
            )
        if not isinstance(value, str):
            raise InvalidArgument(
                f"label {_show(key)} has a non-string value",
                reason=Reason.INVALID_LABELS,
                metadata={"key": _plain(key)},
            )
        size = _utf8_len(value)
        if size is None or _has_control(value):
            raise InvalidArgument(
                f"label {_show(key)} has a value with NUL or control characters",
                reason=Reason.INVALID_LABELS,
                metadata={"key": _plain(key)},
            )
        if size > MAX_LABEL_VALUE_BYTES:
            raise InvalidArgument(
                f"label {_show(key)} has a value of {size} bytes; "
                f"the limit is {MAX_LABEL_VALUE_BYTES}",
                reason=Reason.INVALID_LABELS,
                metadata={"key": _plain(key)},
            )
        result[key] = value
    return result


# File modes

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


# Image references

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
            metadata={"image": _plain(image)},
        )
    return image
