"""The agent side's port: what the channel's router needs from whoever hosts sandboxes.

The engine (sandboxd.engine) implements `AgentAttach` (a pipe to the agent that is a
sandbox's main process, and a rescue from outside) and runs `ExecRequest`s of its own; the
types live here, with their consumer, so that the agent side never imports the engine and the
engine's adapters import this port like any other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sandboxd.agent.transport import Transport


@dataclass(frozen=True)
class ExecRequest:
    """One command to start in a sandbox, as every path that starts one takes it (the agent's
    channel, `docker exec`, the fake): one type, so the paths cannot drift apart."""

    argv: Sequence[str]
    user: str
    env: Mapping[str, str] | None = None
    workdir: str | None = None
    stdin: bool = False
    tty: bool = False
    # No stdin will be written: its EOF may go with the start itself (the agent's channel
    # sends it in the OPEN's write); the caller still closes stdin, which is then a no-op.
    stdin_ends: bool = False


@dataclass(frozen=True)
class ExecStatus:
    """Where a started command is: running, or ended with `exit_code` (None: not recorded;
    -1: ended without one, as a command reset by the server)."""

    running: bool
    exit_code: int | None = None
    pid: int = 0


class Paused(Exception):
    """The engine has frozen the sandbox (docker pause): its agent cannot answer, and nothing
    is to be killed for that."""


@dataclass(frozen=True)
class Attached:
    """A pipe to a sandbox's agent, and the uid:gid the agent (hence every command) runs as."""

    transport: Transport
    user: str
    env: Mapping[str, str] = field(default_factory=dict)  # the sandbox's (the exec's base)
    session_id: str = ""  # the session the server labelled the sandbox with (egress)
    budget: int = 0  # the agent's memory budget (agent/memory.py), sent in HELLO; 0 none
    # HELLO's guard (agent/memory.py, guard_of_container): gVisor's limits the agent keeps
    guard: Mapping[str, int] = field(default_factory=dict)


class AgentAttach(Protocol):
    """The engine's only duty toward the agent (the channel's router, sandboxd.agent.router,
    does the rest): a pipe to it, and a rescue from outside when it stops answering."""

    async def attach(self, sandbox_id: str) -> Attached | None:
        """None when the sandbox's main process is not the agent (`sbx agent`, with or
        without `--user UID:GID`; the agent is off, or the sandbox predates it): its commands
        are the engine's own execs. `Attached.user` is who the agent runs commands as."""
        ...

    async def rescue(self, sandbox_id: str, user: str) -> str:
        """Kill every process of `user` in the sandbox and wake its agent (outside the
        channel); says what was done. `Paused` when the engine has frozen the sandbox."""
        ...
