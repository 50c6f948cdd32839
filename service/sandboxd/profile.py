"""The hardened container profile of a session, as a Docker create request (pure function).

Every control of SECURITY.md's container defaults is set here, in one place, so a test can
read the profile back with `docker inspect` and compare it control by control.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandboxd.models import SessionSpec

HELPER_IN_CONTAINER = "/.sandboxd/sbx"
TMP_BYTES = 16 * 1024 * 1024
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

LABEL_OWNER = "io.sandboxd.owner"
LABEL_SESSION = "io.sandboxd.session"
LABEL_FINGERPRINT = "io.sandboxd.fingerprint"


def container_name(owner_id: str, session_id: str) -> str:
    return f"sandboxd-{owner_id}-{session_id}"


def base_env(spec: SessionSpec) -> dict[str, str]:
    """The complete environment of every command: nothing comes from the server's own."""
    env = {"PATH": DEFAULT_PATH, "HOME": "/workspace", "LANG": "C.UTF-8"}
    env.update(spec.env)
    return env


def container_config(
    *,
    spec: SessionSpec,
    session_id: str,
    owner_id: str,
    fingerprint: str,
    helper_path: Path,
    keeper_user: str,
) -> dict[str, Any]:
    """The create request; the main process idles as `keeper_user`.

    The keeper runs under a uid different from the sandbox user, so `kill -9 -1` run by a
    command cannot end the container (and with it the workspace tmpfs).
    """
    limits = spec.limits
    return {
        "Image": spec.image,
        "Cmd": [HELPER_IN_CONTAINER, "idle"],
        "Entrypoint": [],
        "User": keeper_user,
        "WorkingDir": "/",
        "Env": [f"{k}={v}" for k, v in base_env(spec).items()],
        "Hostname": "sandbox",
        "Labels": {
            LABEL_OWNER: owner_id,
            LABEL_SESSION: session_id,
            LABEL_FINGERPRINT: fingerprint,
        },
        "NetworkDisabled": True,
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "Tty": False,
        "OpenStdin": False,
        "StopSignal": "SIGKILL",
        "HostConfig": {
            "NetworkMode": "none",
            "ReadonlyRootfs": True,
            "Tmpfs": {
                "/workspace": (
                    f"rw,nosuid,nodev,size={limits.workspace_bytes},"
                    f"uid={spec.uid},gid={spec.gid},mode=0700"
                ),
                "/tmp": f"rw,noexec,nosuid,nodev,size={TMP_BYTES},mode=1777",
            },
            "CapDrop": ["ALL"],
            "CapAdd": [],
            "SecurityOpt": ["no-new-privileges:true"],
            "Privileged": False,
            "Memory": limits.memory_bytes,
            "MemorySwap": limits.memory_bytes,
            "NanoCpus": limits.cpu_millis * 1_000_000,
            "PidsLimit": limits.pids,
            "Init": True,
            "IpcMode": "private",
            "Binds": [f"{helper_path.resolve()}:{HELPER_IN_CONTAINER}:ro"],
            "RestartPolicy": {"Name": "no"},
            "AutoRemove": False,
            "LogConfig": {"Type": "none", "Config": {}},
            "Ulimits": [{"Name": "core", "Soft": 0, "Hard": 0}],
        },
    }
