"""sandboxd_client: a typed asyncio client for sandboxd, and the `sandboxctl` CLI.

from sandboxd_client import SandboxClient

async with SandboxClient("127.0.0.1:50051") as client:
    session = await client.create_session(allow=["echo"])
    async for event in session.exec(["echo", "hi"]):
        ...
"""

from sandboxd_client import errors
from sandboxd_client.client import (
    DEFAULT_ADDRESS,
    TLS,
    ArchiveImported,
    Event,
    Exited,
    Keepalive,
    Output,
    RunResult,
    SandboxClient,
    Session,
    Started,
)
from sandboxd_client.errors import SandboxError

__all__ = [
    "DEFAULT_ADDRESS",
    "TLS",
    "ArchiveImported",
    "Event",
    "Exited",
    "Keepalive",
    "Output",
    "RunResult",
    "SandboxClient",
    "SandboxError",
    "Session",
    "Started",
    "errors",
]
