"""sandboxd_client: a typed asyncio client for sandboxd, and the `sandboxctl` CLI.

    from sandboxd_client import SandboxClient

    async with SandboxClient("127.0.0.1:50051") as client:
        async with await client.create_session(allow=["echo"]) as session:
            async for event in session.exec(["echo", "hi"]):
                ...

The package carries its own stubs (`sandboxd_client._gen`); results are the dataclasses of
`sandboxd_client.models`, errors the classes of `sandboxd_client.errors`.

Every name is imported on first use (PEP 562): `import sandboxd_client` (and `sandboxctl
--version`, `sandboxctl completion`) loads neither grpc nor the generated stubs, so the CLI
starts in the time its command needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

# Each public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "AuditEvent": "audit",
    "SessionEvent": "watch",
    "SessionStats": "watch",
    "Preview": "previews",
    "BuildLogLine": "templates",
    "Template": "templates",
    "ImageInfo": "images",
    "PullDone": "images",
    "PullProgress": "images",
    "Volume": "volumes",
    "VolumeMount": "volumes",
    "API_VERSION": "client",
    "DEFAULT_ADDRESS": "client",
    "TLS": "client",
    "SandboxClient": "client",
    "FileEvent": "dir_watch",
    "Reason": "errors",
    "SandboxError": "errors",
    "Interaction": "interaction",
    "RetryPolicy": "_rpc",
    "Session": "session",
    **{
        name: "models"
        for name in (
            "ArchiveImported",
            "EgressEvent",
            "Event",
            "Exited",
            "FileInfo",
            "Keepalive",
            "NetworkPolicy",
            "Output",
            "OutputGap",
            "ProcessInfo",
            "ProxyQuotas",
            "ResourceLimits",
            "RunResult",
            "SecretBinding",
            "ServerInfo",
            "SessionInfo",
            "SnapshotInfo",
            "Started",
            "StateReason",
            "SweepResult",
        )
    },
}

__all__ = [
    "API_VERSION",
    "ArchiveImported",
    "AuditEvent",
    "BuildLogLine",
    "DEFAULT_ADDRESS",
    "EgressEvent",
    "Event",
    "Exited",
    "FileEvent",
    "FileInfo",
    "ImageInfo",
    "Interaction",
    "Keepalive",
    "NetworkPolicy",
    "Output",
    "OutputGap",
    "Preview",
    "ProcessInfo",
    "ProxyQuotas",
    "PullDone",
    "PullProgress",
    "Reason",
    "ResourceLimits",
    "RetryPolicy",
    "RunResult",
    "SandboxClient",
    "SandboxError",
    "SecretBinding",
    "ServerInfo",
    "Session",
    "SessionEvent",
    "SessionInfo",
    "SessionStats",
    "SnapshotInfo",
    "Started",
    "StateReason",
    "SweepResult",
    "TLS",
    "Volume",
    "VolumeMount",
    "Template",
    "__version__",
    "errors",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module when the name is first used, and keep the name."""
    if name == "errors":
        value: Any = importlib.import_module(f"{__name__}.errors")
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # the same names, eagerly, for type checkers and editors
    from sandboxd_client import errors
    from sandboxd_client._rpc import RetryPolicy
    from sandboxd_client.audit import AuditEvent
    from sandboxd_client.client import API_VERSION, DEFAULT_ADDRESS, TLS, SandboxClient
    from sandboxd_client.dir_watch import FileEvent
    from sandboxd_client.errors import Reason, SandboxError
    from sandboxd_client.images import ImageInfo, PullDone, PullProgress
    from sandboxd_client.interaction import Interaction
    from sandboxd_client.models import (
        ArchiveImported,
        EgressEvent,
        Event,
        Exited,
        FileInfo,
        Keepalive,
        NetworkPolicy,
        Output,
        OutputGap,
        ProcessInfo,
        ProxyQuotas,
        ResourceLimits,
        RunResult,
        SecretBinding,
        ServerInfo,
        SessionInfo,
        SnapshotInfo,
        Started,
        StateReason,
        SweepResult,
    )
    from sandboxd_client.previews import Preview
    from sandboxd_client.session import Session
    from sandboxd_client.templates import BuildLogLine, Template
    from sandboxd_client.volumes import Volume, VolumeMount
    from sandboxd_client.watch import SessionEvent, SessionStats
