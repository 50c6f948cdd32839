"""The sandbox-command port: what a caller asks to run, and what it gets back.

A command is one of a few kinds, each a type: what the server means by it, not its command
line (`argv.py` builds that, once). Results are typed too: a stream (`ExecStream`), a status
(`ExecStatus`), never an engine's own document.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandboxd.engine.protocol import ExecStatus, ExecStream


@dataclass(frozen=True)
class Where:
    """A sandbox and the user its commands run as (a session's, or a create in progress's)."""

    container_id: str
    user: str


@dataclass(frozen=True)
class HelperCall:
    """A subcommand of the in-sandbox helper (`sbx read`, `list`, `kill`, `status`...), with
    the server's fixed internal environment."""

    args: tuple[str, ...]


@dataclass(frozen=True)
class Packed:
    """A tool's output compressed in the sandbox by the helper (`sbx zpack`): zstd at
    `level`, the tool's own output held to `cap` bytes before it is compressed."""

    level: int
    cap: int


@dataclass(frozen=True)
class Unpacked:
    """A tool's input rebuilt in the sandbox by the helper (`sbx zunpack`) from the compressed
    bytes and the records it is sent (sandboxd.archive.compressed)."""


@dataclass(frozen=True)
class ToolRun:
    """An internal tool (tar) run by the helper in `cwd` (checked beneath /workspace) with a
    cleared environment: nothing of the session's env reaches it; `through` the helper's
    compression of its output or input, if any."""

    cwd: str
    argv: tuple[str, ...]
    through: Packed | Unpacked | None = None


@dataclass(frozen=True)
class Dial:
    """A byte stream to `port` on the sandbox's loopback (`sbx dial`)."""

    port: int


@dataclass(frozen=True)
class Plain:
    """A command as it is, with the sandbox's environment (a probe: `df`, `cat`); a bare name
    is searched in PATH."""

    argv: tuple[str, ...]


@dataclass(frozen=True)
class Supervised:
    """A caller's command under the helper's supervisor (`sbx run --id`): its own session and
    process group, the whole tree killed by `token`, a backstop `timeout_ms` after which the
    supervisor kills it itself, a terminal of `pty` (rows, cols) when asked."""

    argv: tuple[str, ...]
    token: str
    timeout_ms: int
    cwd: str
    env: Mapping[str, str] = field(default_factory=dict)
    pty: tuple[int, int] | None = None
    stdin_ends: bool = False  # no stdin will be written (ExecRequest.stdin_ends)


SandboxCommand = HelperCall | ToolRun | Dial | Plain | Supervised


@dataclass(frozen=True)
class Detach:
    """A command that outlives the server's connection: the sandbox's agent keeps it running
    and its output in a ring of `buffer_bytes` per stream, under `detach_id`; `budget_bytes`
    (0: the agent's own) bounds what all the sandbox's rings hold together. `timeout_ms` (None:
    none) is the server's timeout, which the agent keeps with its record and gives back in its
    listing with the command's age, so that a server started again keeps the deadline."""

    detach_id: str
    buffer_bytes: int
    budget_bytes: int = 0
    timeout_ms: int | None = None


class DetachedOutput(ExecStream, Protocol):
    """An attach stream of a detached command. `start` and `end` (per fd, 1 and 2): the oldest
    offset the agent's ring held and the bytes produced when the stream (last) opened."""

    start: dict[int, int]
    end: dict[int, int]


class DetachedExecs(Protocol):
    """Commands kept by the in-sandbox agent (sandboxd.commands.detached); only sandboxes with an
    agent have them (`serves`)."""

    async def serves(self, container_id: str, user: str) -> bool: ...

    def exec(
        self, container_id: str, command: SandboxCommand, *, detach: Detach
    ) -> AbstractAsyncContextManager[ExecStream]:
        """Start it: the stream replays its output from offset 0, then follows it live; its
        stdin is the command's. Closing the stream leaves the command running."""
        ...

    def attach(
        self, container_id: str, detach_id: str, offsets: Mapping[int, int] | None = None
    ) -> AbstractAsyncContextManager[DetachedOutput]:
        """Its output from `offsets` (fd 1, 2; default 0), or from the oldest byte still held
        when they are older (a (fd + GAP_FD, length) item first), then live, then its exit."""
        ...

    async def listing(self, container_id: str) -> list[dict[str, Any]]:
        """The agent's records: `id`, `pid`, `running`, `exit_code`, `signal`."""
        ...

    async def forget(self, container_id: str, detach_id: str) -> None: ...


class SandboxCommands(Protocol):
    """The one way into a sandbox's processes (sandboxd.commands.sandbox: the agent first,
    the engine's exec as the fallback; the unit tests' fake)."""

    def open(
        self, where: Where, command: SandboxCommand, *, stdin: bool = False
    ) -> AbstractAsyncContextManager[ExecStream]:
        """Start `command` as `where.user`; the stream is closed when the context exits. With
        `stdin` the command reads what is written (and sees EOF at `close_stdin`)."""
        ...

    async def resize(self, exec_id: str, rows: int, cols: int) -> None:
        """Set the terminal size of a running command started with a pty (SIGWINCH)."""
        ...

    async def status(self, exec_id: str) -> ExecStatus:
        """Whether the command of `exec_id` (its stream's) still runs, and its exit code."""
        ...

    @property
    def detached(self) -> DetachedExecs | None:
        """Commands the sandbox's agent keeps beyond the server's life; None without agents."""
        ...


__all__ = [
    "Detach",
    "DetachedExecs",
    "DetachedOutput",
    "Dial",
    "ExecStatus",
    "HelperCall",
    "Packed",
    "Plain",
    "SandboxCommand",
    "SandboxCommands",
    "Supervised",
    "ToolRun",
    "Unpacked",
    "Where",
]
