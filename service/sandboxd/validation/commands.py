"""argv, the command allowlist and the environment a command runs with: what decides which
program runs, so the rules that keep the allowlist meaningful live together."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from sandboxd.errors import InvalidArgument, PermissionDenied
from sandboxd.reasons import Reason
from sandboxd.validation._text import _has_control, _plain, _show, _utf8_len

# argv and the shell policy

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
    raise PermissionDenied(
        message, reason=Reason.COMMAND_NOT_ALLOWED, metadata={"command": _plain(name)}
    )


# Environment

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
    return InvalidArgument(message, reason=reason, metadata={"key": _plain(key)})


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
            raise InvalidArgument(
                f"env key {_show(key)} is invalid: keys match [A-Za-z_][A-Za-z0-9_]*",
                reason=Reason.INVALID_ENV,
                metadata={"key": _plain(key)},
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
