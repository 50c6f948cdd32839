"""Pure validation of caller input: paths, argv, env, user, ids, labels, file modes, durations,
numeric limits.

A package of five modules (paths, commands, identity, durations, limits); this module
re-exports them so callers keep writing `validation.validate_argv(...)`. A sixth,
`image_refs` (the spelling of image references and allowlist patterns), is imported by name.

Everything a request carries passes through here before it reaches Docker, so each rule in
SECURITY.md that can be checked on the text alone is checked once, in one place. Functions
return a normalised copy or raise `InvalidArgument` / `PermissionDenied` with a stable
`reason` and a message a person can act on. No I/O: the in-container real-path checks
(symlinks) happen later, in the engine layer.
"""

from __future__ import annotations

from sandboxd.validation.commands import (
    ALLOWED_BIN_DIRS,
    ENV_KEY_RE,
    LOADER_ENV_KEYS,
    LOADER_ENV_PREFIX,
    MAX_ARG_BYTES,
    MAX_ARGS,
    MAX_ARGV_TOTAL_BYTES,
    MAX_ENV_ENTRIES,
    MAX_ENV_KEY_BYTES,
    MAX_ENV_VALUE_BYTES,
    RESERVED_ENV_KEYS,
    check_command_allowed,
    command_name,
    validate_argv,
    validate_env,
)
from sandboxd.validation.durations import (
    MAX_DURATION_S,
    MAX_SPAN_S,
    duration_seconds,
    positive_duration,
)
from sandboxd.validation.identity import (
    DEFAULT_GID,
    DEFAULT_UID,
    IMAGE_REF_RE,
    LABEL_KEY_RE,
    MAX_IMAGE_REF,
    MAX_LABEL_VALUE_BYTES,
    MAX_LABELS,
    SESSION_ID_RE,
    parse_user,
    validate_file_mode,
    validate_image,
    validate_labels,
    validate_process_id,
    validate_session_id,
)
from sandboxd.validation.limits import at_most
from sandboxd.validation.paths import (
    MAX_PATH_BYTES,
    MAX_PATH_COMPONENT_BYTES,
    WORKSPACE,
    validate_cwd,
    workspace_abspath,
    workspace_relpath,
)

__all__ = [
    "ALLOWED_BIN_DIRS",
    "DEFAULT_GID",
    "DEFAULT_UID",
    "ENV_KEY_RE",
    "IMAGE_REF_RE",
    "LABEL_KEY_RE",
    "LOADER_ENV_KEYS",
    "LOADER_ENV_PREFIX",
    "MAX_ARGS",
    "MAX_ARGV_TOTAL_BYTES",
    "MAX_ARG_BYTES",
    "MAX_DURATION_S",
    "MAX_ENV_ENTRIES",
    "MAX_ENV_KEY_BYTES",
    "MAX_ENV_VALUE_BYTES",
    "MAX_IMAGE_REF",
    "MAX_LABELS",
    "MAX_LABEL_VALUE_BYTES",
    "MAX_PATH_BYTES",
    "MAX_SPAN_S",
    "MAX_PATH_COMPONENT_BYTES",
    "RESERVED_ENV_KEYS",
    "SESSION_ID_RE",
    "WORKSPACE",
    "at_most",
    "check_command_allowed",
    "command_name",
    "duration_seconds",
    "parse_user",
    "positive_duration",
    "validate_argv",
    "validate_cwd",
    "validate_env",
    "validate_file_mode",
    "validate_image",
    "validate_labels",
    "validate_process_id",
    "validate_session_id",
    "workspace_abspath",
    "workspace_relpath",
]
