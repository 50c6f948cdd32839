"""The container engine seen from the domain: the `Engine` protocol and its Docker adapter.

`from sandboxd.engine import Engine, ExecStream` gives the protocol types; `DockerEngine` is
the one implementation the server runs (see docs/architecture.md for adding another).
"""

from sandboxd.engine.docker import DockerEngine
from sandboxd.engine.docker_exec import DockerExecStream
from sandboxd.engine.protocol import (
    Engine,
    ExecRequest,
    ExecStream,
    SandboxInfo,
    SandboxRequest,
    SandboxStats,
    SandboxStatus,
)

__all__ = [
    "DockerEngine",
    "DockerExecStream",
    "Engine",
    "ExecRequest",
    "ExecStream",
    "SandboxInfo",
    "SandboxRequest",
    "SandboxStats",
    "SandboxStatus",
]
