"""Every byte of a background process the sandbox's agent keeps reaches every AttachProcess
reader, across every hand-over between the server's live tail and the agent's ring
(processes/follow.py): the real agent (`sbx agent` over pipes), the real channel, router
and detached streams, the real ProcessManager and Command; only the executor's wrapping of the
command in `sbx run` is left out (there is no sandbox here).

A fast writer prints numbered lines; many readers follow it from offset 0 at different speeds,
with a tail and stream windows far smaller than the output, so each falls behind the tail,
reads the agent, catches up and comes back many times, and some are on the agent's stream when
the process exits. Each must get the whole output, byte for byte, in order, with no gap (the
agent's ring holds all of it), then the exit."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from agent_pipes import CHANNEL_ENV, Builds, PipeTransport, agent_process
from conftest import first_difference
from engine_contract import running_session
from sandboxd.agent.router import AgentRouter, Attached, ChannelSettings
from sandboxd.commands import Detach, Plain
from sandboxd.commands.detached import AgentProcesses, DetachedStream
from sandboxd.domain_events import CommandExited, CommandStarted
from sandboxd.errors import Internal
from sandboxd.execution import Command
from sandboxd.models import ExecExited, ExecKeepalive, ExecOutput, ExecSpec, ExecStarted, Session
from sandboxd.models import OutputStream as S
from sandboxd.processes import ProcessManager
from sandboxd.processes import budget as process_room
from sandboxd.processes import record as process_record
from sandboxd.processes.record import AttachEvent, OutputGap, StartOptions

KiB = 1024
MiB = 1024 * KiB
LINE = 16  # "%015d\n"


def _lines(count: int) -> bytes:
    return b"".join(b"%015d\n" % i for i in range(count))


def _writer(count: int, stderr_every: int, pause_s: float) -> list[str]:
    """A fast writer of `count` numbered lines to stdout, in 64 KiB writes, and a short line
    to stderr every `stderr_every` writes (both streams move, in an order to keep); it
    pauses `pause_s` every 16 writes (bursts of 1 MiB: readers fall behind in a burst and
    catch up between two)."""
    code = (
        "import os,time\n"
        f"n={count}\n"
        "i=0\nw=0\n"
        "while i<n:\n"
        "    j=min(n,i+4096)\n"
        "    os.write(1,b''.join(b'%015d\\n'%k for k in range(i,j)))\n"
        "    i=j\n    w+=1\n"
        f"    if w%{stderr_every}==0: os.write(2,b'e%07d\\n'%w)\n"
        f"    if w%16==0: time.sleep({pause_s})\n"
    )
    return [sys.executable, "-c", code]


def _stderr_of(count: int, stderr_every: int) -> bytes:
    writes = -(-count // 4096)
    return b"".join(b"e%07d\n" % w for w in range(1, writes + 1) if w % stderr_every == 0)


class _Port:
    """The engine's side of the router: the agent on pipes, as the session's user."""

    def __init__(self, agent: asyncio.subprocess.Process, user: str) -> None:
        self._agent = agent
        self._user = user

    async def attach(self, sandbox_id: str) -> Attached | None:
        return Attached(PipeTransport(self._agent), self._user, CHANNEL_ENV)

    async def rescue(self, sandbox_id: str, user: str) -> str:
        raise AssertionError("the agent on pipes stopped answering")


class _CountingAgent(AgentProcesses):
    """The real detached commands, counting the readers' attach streams (each one a switch
    from the tail to the agent's ring)."""

    attaches = 0

    @contextlib.asynccontextmanager
    async def attach(
        self, container_id: str, detach_id: str, offsets: Mapping[int, int] | None = None
    ) -> AsyncIterator[DetachedStream]:
        self.attaches += 1
        async with super().attach(container_id, detach_id, offsets) as stream:
            yield stream


class _Breaking:
    """The server's own reader's stream, broken after `after` bytes (as when the agent resets
    it: IO): the server's record then ends short of what the process writes on."""

    def __init__(self, stream: DetachedStream, after: int) -> None:
        self._stream = stream
        self._left = after

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)

    async def read(self) -> tuple[int, bytes] | None:
        if self._left <= 0:
            raise Internal("the agent reset the exec stream: IO: (injected)")
        item = await self._stream.read()
        if item is not None:
            self._left -= len(item[1])
        return item


class _AgentExecutor:
    """The executor's part the ProcessManager uses, with `Executor.start`'s detached path
    minus the `sbx run` wrapper: the command runs as the agent's own detached process (and is
    not killed when the server's reader fails: it writes on into the agent's ring)."""

    def __init__(self, detached: _CountingAgent) -> None:
        self.detached = detached
        self.break_after: int | None = None

    @contextlib.asynccontextmanager
    async def start(
        self,
        session: Session,
        spec: ExecSpec,
        *,
        process_id: str = "",
        token: str = "",
        detach: Detach | None = None,
    ) -> AsyncIterator[Command]:
        assert detach is not None
        async with self.detached.exec(
            session.container_id, Plain(tuple(spec.argv)), detach=detach
        ) as stream:
            read = stream if self.break_after is None else _Breaking(stream, self.break_after)
            command = Command(
                self,  # type: ignore[arg-type]
                session,
                spec,
                process_id or token,
                token,
                read,  # type: ignore[arg-type]
                tty=False,
            )
            command.kept_by_agent = True
            try:
                yield command
            finally:
                await command._stop()


class _Hooks:
    """The manager's start and exit events as calls of `on_start` / `on_exit` with the
    manager's own record of the process (what it holds at the moment of the event)."""

    def __init__(self, on_start: Any = None, on_exit: Any = None) -> None:
        self.manager: ProcessManager | None = None
        self._on = {CommandStarted: on_start, CommandExited: on_exit}

    def emit(self, event: Any) -> None:
        hook = self._on.get(type(event))
        if hook is not None and self.manager is not None:
            hook(None, self.manager.get(event.session_id, event.process_id))


@contextlib.asynccontextmanager
async def _manager(
    helper_builds: Builds, tmp_path: Path, window: int, window_max: int, **hooks: Any
) -> AsyncIterator[tuple[ProcessManager, Session]]:
    root = tmp_path / "ws"
    root.mkdir()
    session = running_session()
    settings = ChannelSettings(window=window, window_max=window_max, keepalive_s=30.0)
    async with agent_process(helper_builds.get("static"), root, CHANNEL_ENV) as agent:
        router = AgentRouter(_Port(agent, session.spec.user), settings)  # type: ignore[arg-type]
        observer = _Hooks(**hooks)
        pm = ProcessManager(_AgentExecutor(_CountingAgent(router)), observer)  # type: ignore[arg-type]
        observer.manager = pm
        try:
            yield pm, session
        finally:
            await pm.close()
            await router.close()


async def _read_all(
    events: AsyncIterator[AttachEvent], rng: random.Random, slow: float
) -> tuple[bytes, bytes, list[OutputGap], ExecExited | None, int]:
    """What one reader got: stdout, stderr (each checked contiguous from 0), gaps, the exit,
    and how many events came after the exit (none may). `slow`: the chance of a pause after
    an event, so the reader falls behind the tail now and then."""
    out = {S.STDOUT: bytearray(), S.STDERR: bytearray()}
    gaps: list[OutputGap] = []
    exited: ExecExited | None = None
    after = 0
    async for event in events:
        if exited is not None:
            after += 1
        if isinstance(event, ExecOutput):
            got = out[event.stream]
            assert event.offset == len(got), (event.stream, event.offset, len(got))
            got += event.data
        elif isinstance(event, OutputGap):
            gaps.append(event)
        elif isinstance(event, ExecExited):
            exited = event
        else:
            assert isinstance(event, ExecStarted | ExecKeepalive), event
        if rng.random() < slow:
            await asyncio.sleep(rng.random() * 0.01)
    return bytes(out[S.STDOUT]), bytes(out[S.STDERR]), gaps, exited, after


async def _stress(
    pm: ProcessManager, session: Session, count: int, readers: int, seed: int, pause_s: float
) -> list[str]:
    """One process of `count` lines followed by `readers` readers from 0; what went wrong."""
    rng = random.Random(seed)
    total = count * LINE
    spec = ExecSpec(_writer(count, 7, pause_s), "/", {}, b"", 300.0, total + MiB)
    proc = await pm.start(session, spec, f"stress-{seed}", options=StartOptions(total + MiB))
    assert proc.agent is not None, "the agent keeps this process's output"

    async def reader(i: int) -> tuple[bytes, bytes, list[OutputGap], ExecExited | None, int]:
        await asyncio.sleep(rng.random() * pause_s * total / MiB)  # some start behind the tail
        slow = (0.0, 0.1, 0.5)[i % 3]
        # Short keepalives for half of them: a reader waiting on the agent's stream looks at
        # the tail again at each, so it comes back to it often.
        keepalive = (0.01, 30.0)[i // 3 % 2]
        events = pm.follow(proc, 0, 0, keepalive)
        return await _read_all(events, random.Random(seed * 100 + i), slow)

    async with asyncio.timeout(240):
        results = await asyncio.gather(*(reader(i) for i in range(readers)))
    want_out, want_err = _lines(count), _stderr_of(count, 7)
    problems = []
    for i, (out, err, gaps, exited, after) in enumerate(results):
        if out != want_out or err != want_err or gaps or exited != proc.exited or after:
            first_bad = first_difference(out, want_out)
            problems.append(
                f"reader {i}: stdout {len(out)}/{len(want_out)} (first difference at "
                f"{first_bad}), stderr {len(err)}/{len(want_err)}, gaps {gaps}, "
                f"exit {exited} (record {proc.exited}), {after} events after it"
            )
    want_code = 0 if pm._executor.break_after is None else -1  # type: ignore[attr-defined]
    assert proc.exited is not None and proc.exited.exit_code == want_code, proc.exited
    return problems


@pytest.fixture
def small_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64 KiB live tail: readers of a 16 MB burst leave it and come back to it often."""
    monkeypatch.setattr(process_record, "TAIL_BYTES", 64 * KiB)
    monkeypatch.setattr(process_room, "TAIL_BYTES", 64 * KiB)


def _attaches(pm: ProcessManager) -> int:
    return pm._executor.detached.attaches  # type: ignore[union-attr]


@pytest.mark.usefixtures("small_tail")
@pytest.mark.parametrize(
    ("window", "window_max"),
    [(16 * KiB, 64 * KiB), (MiB, 8 * MiB)],
    ids=["small-windows", "default-windows"],
)
async def test_every_reader_of_a_fast_writer_gets_every_byte_across_switches(
    helper_builds: Builds, tmp_path: Path, window: int, window_max: int
) -> None:
    """16 MB in 1 MiB bursts, 12 readers from 0 (some late, some slow), a 64 KiB tail; with
    small stream windows, and with the server's default ones (1 MiB growing to 8 MiB: a
    reader's agent stream runs far ahead of what it hands on)."""
    async with _manager(helper_builds, tmp_path, window, window_max) as (pm, session):
        problems = []
        for seed in range(3):
            problems += await _stress(pm, session, 1_000_000, 12, seed, pause_s=0.05)
        assert not problems, "\n".join(problems)
        # More agent streams than readers: readers went back and forth (80-90 and 340-390
        # measured with small and default windows).
        switches = _attaches(pm)
        assert switches > 3 * 12, f"readers must switch between the tail and the agent: {switches}"


@pytest.mark.usefixtures("small_tail")
async def test_readers_get_every_byte_when_the_servers_own_reader_fails_midway(
    helper_builds: Builds, tmp_path: Path
) -> None:
    """The server's own reader of the process breaks after 6 MB (its record's exit is made
    up: -1) while the process writes on into the agent's ring: readers on the tail must not
    take the server's short end for the end of output; they read the rest from the agent's
    copy, to its end (before the fix: `exited` after about 6 MB, no gap, no error)."""
    async with _manager(helper_builds, tmp_path, MiB, 8 * MiB) as (pm, session):
        pm._executor.break_after = 6_000_000  # type: ignore[attr-defined]
        problems = []
        for seed in range(10, 12):
            problems += await _stress(pm, session, 1_000_000, 8, seed, pause_s=0.05)
        assert not problems, "\n".join(problems)


async def test_a_process_that_exits_at_once_is_announced_started_then_exited(
    helper_builds: Builds, tmp_path: Path
) -> None:
    """The feed's PROCESS_STARTED comes from the manager, before anything of the process is
    read, so its PROCESS_EXITED never comes first. When the StartProcess call's answer made
    it, a command that exited at once was announced exited first (seen in CI: a watcher
    waiting for STARTED had already passed the EXITED)."""
    seen: list[tuple[str, str, bool]] = []

    def hook(kind: str) -> Any:
        return lambda session, proc: seen.append((kind, proc.process_id, proc.exited is None))

    async with _manager(
        helper_builds, tmp_path, MiB, 8 * MiB, on_start=hook("start"), on_exit=hook("exit")
    ) as (pm, session):
        for i in range(20):
            spec = ExecSpec(["/bin/sh", "-c", "exit 5"], "/", {}, b"", 30.0, MiB)
            proc = await pm.start(session, spec, f"quick-{i}")
            async with asyncio.timeout(30):
                await proc.task
            assert proc.exited is not None and proc.exited.exit_code == 5
    assert seen == [
        (kind, f"quick-{i}", kind == "start") for i in range(20) for kind in ("start", "exit")
    ]
