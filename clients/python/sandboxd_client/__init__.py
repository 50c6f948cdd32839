"""sandboxd_client: a typed asyncio client for sandboxd, and the `sandboxctl` CLI.

    from sandboxd_client import SandboxClient

    async with SandboxClient("127.0.0.1:50051") as client:
        async with await client.create_session(allow=["echo"]) as session:
            async for event in session.exec(["echo", "hi"]):
                ...

The package carries its own stubs (`sandboxd_client._gen`); results are the dataclasses of
`sandboxd_client.models`, errors the classes of `sandboxd_client.errors`.
"""

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

__version__ = "0.2.0"

__all__ = [
    "AuditEvent",
    "SessionEvent",
    "SessionStats",
    "Preview",
    "BuildLogLine",
    "Template",
    "Volume",
    "VolumeMount",
    "ImageInfo",
    "PullDone",
    "PullProgress",
    "API_VERSION",
    "DEFAULT_ADDRESS",
    "TLS",
    "ArchiveImported",
    "EgressEvent",
    "Event",
    "Exited",
    "FileEvent",
    "FileInfo",
    "Interaction",
    "Keepalive",
    "NetworkPolicy",
    "Output",
    "OutputGap",
    "ProcessInfo",
    "ProxyQuotas",
    "SecretBinding",
    "Reason",
    "ResourceLimits",
    "RetryPolicy",
    "RunResult",
    "SandboxClient",
    "SandboxError",
    "ServerInfo",
    "Session",
    "SessionInfo",
    "StateReason",
    "SnapshotInfo",
    "Started",
    "SweepResult",
    "__version__",
    "errors",
]
