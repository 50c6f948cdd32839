"""The container engine seen from the domain: the `Engine` protocol and its Docker adapter.

`from sandboxd.engine import Engine, ExecStream` gives the protocol types; `DockerEngine` is
the one implementation the server runs (see docs/architecture.md for adding another).
"""

from sandboxd.engine.docker import DockerEngine, DockerExecStream
from sandboxd.engine.protocol import (
    Engine,
    ExecStream,
    NetworkAddress,
    NetworkInfo,
    SandboxInfo,
    SandboxRequest,
    SandboxStats,
    SandboxStatus,
    SessionNetwork,
)

__all__ = [
    "DockerEngine",
    "DockerExecStream",
    "Engine",
    "ExecStream",
    "NetworkAddress",
    "NetworkInfo",
    "SandboxInfo",
    "SandboxRequest",
    "SandboxStats",
    "SandboxStatus",
    "SessionNetwork",
]
