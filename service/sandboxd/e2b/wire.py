"""E2B's user model on sandboxd's workspace, and the JSON codec's value rules.

E2B's sandboxes have a user `user` with home /home/user and resolve relative paths against it.
A sandboxd session has one writable tree, /workspace; the `base` template makes /home/user a
symlink to it. Paths are translated here, as text, before sandboxd's own path rules see them
(which confine every path to /workspace, `..` refused): this module widens nothing.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from google.protobuf import timestamp_pb2

from sandboxd.digits import decimal
from sandboxd.e2b.connect import ConnectError

HOME = "/home/user"
WORKSPACE = "/workspace"


def to_workspace(path: str) -> str:
    """An E2B path as a workspace path: relative and under /home/user are under /workspace.
    Anything else is passed on unchanged, for sandboxd to refuse with its own reason."""
    if path == HOME or path.startswith(HOME + "/"):
        return WORKSPACE + path[len(HOME) :]
    if path == "~" or path.startswith("~/"):
        return WORKSPACE + path[1:]
    if not path.startswith("/"):
        return f"{WORKSPACE}/{path}" if path else WORKSPACE
    return path


def to_home(path: str) -> str:
    """A workspace path as E2B's clients see it: under /home/user."""
    if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
        return HOME + path[len(WORKSPACE) :]
    if not path.startswith("/"):  # relative to the workspace, as sandboxd's replies put it
        return f"{HOME}/{path}" if path not in ("", ".") else HOME
    return path


def sandbox_id(session_id: str) -> str:
    """A session id as E2B's sandbox id: a DNS label. With authentication on, ids are
    `<tenant>.<rest>`; the dot is written `--` (`alpha.s-1f2e` is `alpha--s-1f2e`)."""
    if "." in session_id and "--" not in session_id:
        head, _, tail = session_id.rpartition(".")
        return f"{head}--{tail}"
    return session_id


def session_id(sandbox: str) -> str:
    """The inverse of `sandbox_id` (a session id with `--` and no `.` reads as a tenant's)."""
    if "--" in sandbox and "." not in sandbox:
        head, _, tail = sandbox.rpartition("--")
        return f"{head}.{tail}"
    return sandbox


def field(message: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """A field by its proto name or its JSON (lowerCamel) name, as the JSON codec accepts both."""
    if name in message:
        return message[name]
    head, *rest = name.split("_")
    camel = head + "".join(part[:1].upper() + part[1:] for part in rest)
    return message.get(camel, default)


def text(message: Mapping[str, Any], name: str) -> str:
    value = field(message, name, "")
    if not isinstance(value, str):
        raise ConnectError("invalid_argument", f"{name} must be a string")
    return value


def uint(message: Mapping[str, Any], name: str) -> int:
    """A uint32/int64 field: a JSON number or a decimal string (both are the codec's)."""
    value = field(message, name, 0)
    if isinstance(value, str):
        value = decimal(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ConnectError("invalid_argument", f"{name} must be a non-negative integer")
    return value


def obj(message: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = field(message, name, None)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConnectError("invalid_argument", f"{name} must be an object")
    return value


def string_map(message: Mapping[str, Any], name: str) -> dict[str, str]:
    value = obj(message, name)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConnectError("invalid_argument", f"{name} must map strings to strings")
    return value


def data(message: Mapping[str, Any], name: str) -> bytes:
    """A bytes field: base64 (standard or URL-safe, padded or not: the codec accepts both)."""
    value = field(message, name, "")
    if not isinstance(value, str):
        raise ConnectError("invalid_argument", f"{name} must be base64 text")
    value = value.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ConnectError("invalid_argument", f"{name} is not valid base64") from None


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def timestamp(ts: timestamp_pb2.Timestamp) -> str:
    """RFC 3339 in UTC with a Z, the codec's form of a Timestamp."""
    return str(ts.ToJsonString())


def rfc3339(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")
