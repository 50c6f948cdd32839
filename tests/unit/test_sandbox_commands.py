"""The sandbox-command port's one owner: the command line of each kind (built once), the agent
first and the engine's exec as the fallback, typed statuses; and the lifecycle that keeps the
agents' channels in step with the engine's sandboxes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from engine_contract import request
from fakes import FakeEngine
from sandboxd.commands import (
    Dial,
    HelperCall,
    Packed,
    Plain,
    Supervised,
    ToolRun,
    Unpacked,
    Where,
)
from sandboxd.commands.argv import INTERNAL_ENV, argv_of, env_of
from sandboxd.commands.lifecycle import WithAgentChannels
from sandboxd.commands.sandbox import AgentFirstCommands
from sandboxd.engine.protocol import ExecRequest, ExecStatus
from sandboxd.errors import Internal
from sandboxd.profile import HELPER_IN_CONTAINER as SBX

WHERE = Where("c1", "1000:1000")


def test_each_kind_has_one_command_line_and_environment() -> None:
    tool = ToolRun("d", ("tar", "-c"))
    assert argv_of(tool) == [SBX, "run", "--clean-env", "--cwd", "d", "--", "tar", "-c"]
    assert argv_of(HelperCall(("stat", "x"))) == [SBX, "stat", "x"]
    assert argv_of(Dial(8080)) == [SBX, "dial", "8080"]
    assert argv_of(Plain(("df", "-k"))) == ["df", "-k"]
    run = Supervised(("sh",), token="p-1", timeout_ms=5000, cwd="/w", env={"A": "1"})
    head = [SBX, "run", "--id", "p-1", "--timeout-ms", "5000", "--cwd", "/w"]
    assert argv_of(run) == [*head, "--", "sh"]
    tty = Supervised(("sh",), token="p-1", timeout_ms=5000, cwd="/w", pty=(24, 80))
    assert argv_of(tty) == [*head, "--tty", "24x80", "--", "sh"]
    assert env_of(HelperCall(())) is INTERNAL_ENV and env_of(Dial(1)) is INTERNAL_ENV
    assert env_of(tool) is INTERNAL_ENV
    assert env_of(Plain(("df",))) is None and env_of(run) == {"A": "1"}


def test_the_helpers_compression_of_a_tool_is_spelled_here_too() -> None:
    """An archive's zstd (`sbx zpack`, `sbx zunpack` in front of tar) is a kind of tool run,
    not a command line its caller writes."""
    run = [SBX, "run", "--clean-env", "--cwd", "d", "--"]
    packed = ToolRun("d", ("tar", "-c"), Packed(3, 1000))
    assert argv_of(packed) == [*run, SBX, "zpack", "3", "1000", "--", "tar", "-c"]
    unpacked = ToolRun("d", ("tar", "-x"), Unpacked())
    assert argv_of(unpacked) == [*run, SBX, "zunpack", "--", "tar", "-x"]
    assert env_of(packed) is INTERNAL_ENV and env_of(unpacked) is INTERNAL_ENV


class _Exec:
    """The engine's own exec, recording what it was asked."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, ExecRequest]] = []

    @contextlib.asynccontextmanager
    async def exec(self, sandbox_id: str, req: ExecRequest) -> AsyncIterator[Any]:
        self.requests.append((sandbox_id, req))
        yield "engine-stream"

    async def exec_resize(self, exec_id: str, rows: int, cols: int) -> None:
        self.requests.append((exec_id, ExecRequest(["resize"], "")))

    async def exec_status(self, exec_id: str) -> ExecStatus:
        return ExecStatus(running=False, exit_code=3)


class _Router:
    """A router whose agent runs commands as `user` only."""

    def __init__(self, user: str) -> None:
        self.user = user
        self.opened: list[ExecRequest] = []

    async def serves(self, sandbox_id: str, user: str) -> object | None:
        return "channel" if user == self.user else None

    @contextlib.asynccontextmanager
    async def exec(self, sandbox_id: str, channel: object, req: ExecRequest) -> AsyncIterator[Any]:
        self.opened.append(req)
        yield "agent-stream"

    @staticmethod
    def owns(exec_id: str) -> bool:
        return exec_id.startswith("agent-")

    def inspect(self, exec_id: str) -> ExecStatus:
        return ExecStatus(running=True)


async def test_the_agent_first_and_the_engines_exec_when_it_cannot() -> None:
    engine, exec_ = FakeEngine(), _Exec()
    router = _Router("1000:1000")
    commands = AgentFirstCommands(engine, exec_, router)  # type: ignore[arg-type]
    async with commands.open(WHERE, HelperCall(("stat", "x")), stdin=True) as stream:
        assert stream == "agent-stream"
    assert router.opened[0].argv == [SBX, "stat", "x"] and router.opened[0].stdin
    assert router.opened[0].env is INTERNAL_ENV and not exec_.requests
    other = Where("c1", "2000:2000")  # the agent runs as someone else: only the engine can
    async with commands.open(other, Plain(("true",))) as stream:
        assert stream == "engine-stream"
    assert exec_.requests == [("c1", ExecRequest(["true"], "2000:2000"))]
    assert await commands.status("agent-c1-1") == ExecStatus(running=True)
    assert await commands.status("0123abc") == ExecStatus(running=False, exit_code=3)
    without = AgentFirstCommands(engine, exec_, None)  # type: ignore[arg-type]
    assert without.detached is None
    async with without.open(WHERE, Dial(80), stdin=True) as stream:
        assert stream == "engine-stream"


class _Channels:
    """The router's side of the lifecycle, recording what it was told."""

    def __init__(self) -> None:
        self.log: list[str] = []

    async def open(self, sandbox_id: str) -> None:
        self.log.append("open")

    async def forget(self, sandbox_id: str) -> None:
        self.log.append("forget")

    def checkpointing(self, sandbox_id: str, ending: object) -> None:
        self.log.append("checkpointing" if ending is not None else "not checkpointing")


async def test_the_channels_follow_start_removal_and_checkpoints() -> None:
    engine, channels = FakeEngine(), _Channels()
    lifecycle = WithAgentChannels(engine, channels)  # type: ignore[arg-type]
    sid = await lifecycle.create_sandbox(request("o", "s"))
    await lifecycle.start_sandbox(sid)
    assert channels.log == ["open"]
    engine.fail("checkpoint_sandbox")  # refused before it stopped anything: runs on as it was
    with pytest.raises(Internal):
        await lifecycle.checkpoint_sandbox(sid, "m")
    assert channels.log[1:] == ["checkpointing", "not checkpointing"]
    await lifecycle.checkpoint_sandbox(sid, "m")
    assert channels.log[3:] == ["checkpointing", "forget"]  # its attach ended with it
    await lifecycle.restore_sandbox(sid, "m", engine.read_checkpoint(sid, "m"))
    assert channels.log[5:] == ["open"]  # the same agent: a new epoch
    await lifecycle.remove_sandbox(sid)
    assert channels.log[6:] == ["forget"] and sid not in engine.sandboxes


def test_only_the_owner_spells_the_helpers_command_line() -> None:
    """Outside `commands/argv.py` no module names the helper's path to run it: the profile that
    declares it (and the agent runner's PATH search through `sbx run`), and the Docker adapter,
    whose sandboxes' main process it is (`sbx agent`, `sbx idle`)."""
    import ast
    from pathlib import Path

    import sandboxd

    root = Path(sandboxd.__file__).parent
    allowed = {"commands/argv.py", "profile.py", "engine/docker_profile.py"}
    spelled = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if name.startswith("v1/") or name in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(), name)):
            if isinstance(node, ast.Name | ast.alias) and "HELPER_IN_CONTAINER" in (
                getattr(node, "id", None),
                getattr(node, "name", None),
            ):
                spelled.append(f"{name}:{getattr(node, 'lineno', '?')}")
            elif isinstance(node, ast.Constant) and node.value == SBX:
                spelled.append(f"{name}:{node.lineno}")
    assert not spelled, f"the helper's command line outside commands/argv.py: {spelled}"
