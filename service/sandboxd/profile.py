"""The contract between sandboxd and a sandbox image, whatever engine runs it.

Where the in-sandbox helper is mounted, what environment every command starts from, how
sandboxes are named. The engine-specific hardened profile is built by the adapter
(`sandboxd.engine.docker_profile` for Docker).
"""

from __future__ import annotations

from collections.abc import Sequence

from sandboxd.models import SessionSpec

HELPER_IN_CONTAINER = "/.sandboxd/sbx"
TMP_BYTES = 16 * 1024 * 1024
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def container_name(owner_id: str, session_id: str) -> str:
    return f"sandboxd-{owner_id}-{session_id}"


def base_env(spec: SessionSpec) -> dict[str, str]:
    """The complete environment of every command: nothing comes from the server's own."""
    env = {"PATH": DEFAULT_PATH, "HOME": "/workspace", "LANG": "C.UTF-8"}
    env.update(spec.env)
    return env


def searched(argv: Sequence[str]) -> list[str]:
    """`argv` for a runner that executes absolute paths only (the agent): a bare name (`df`)
    goes through `sbx run`, which searches PATH as the engine's exec does."""
    if argv and not argv[0].startswith("/"):
        return [HELPER_IN_CONTAINER, "run", "--", *argv]
    return list(argv)
