"""ProcessManager's record of Exec, Run and Interact commands (`track`), without an engine: the
events pass through unchanged, the command is found by its id while it runs and after, a call
that ends early leaves a killed record, and ListProcesses still lists background ones only."""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import AsyncIterator

import pytest
from sandboxd.commands import Detach
from sandboxd.errors import FailedPrecondition, Internal, Unavailable
from sandboxd.isolation import Isolation
from sandboxd.models import ExecEvent, ExecExited, ExecOutput, ExecSpec, ExecStarted
from sandboxd.models import OutputStream as S
from sandboxd.processes import BackgroundProcess, ProcessManager, ProcessOrigin
from sandboxd.processes import manager as processes


def _spec(cap: int = 1 << 20) -> ExecSpec:
    return ExecSpec(argv=["x"], cwd=".", env={}, stdin=b"", timeout_s=5, max_output_bytes=cap)


async def _events(*items: ExecEvent) -> AsyncIterator[ExecEvent]:
    for item in items:
        yield item


def _manager() -> ProcessManager:
    return ProcessManager(executor=None)  # type: ignore[arg-type]  # track never runs commands


async def test_track_passes_events_through_and_records_the_command() -> None:
    pm = _manager()
    events = [
        ExecStarted("p-1"),
        ExecOutput(S.STDOUT, b"hello", 0),
        ExecExited(3, "", False, False, 0.1),
    ]
    seen = [e async for e in pm.track("s", _spec(), ProcessOrigin.RUN, _events(*events))]
    assert seen == events
    proc = pm.get("s", "p-1")
    assert proc.origin is ProcessOrigin.RUN and proc.token == "p-1"
    assert proc.exited is not None and proc.exited.exit_code == 3
    assert proc.output[S.STDOUT].end == 5
    assert pm.list("s") == []  # not a background process


async def test_a_call_that_ends_early_leaves_a_killed_record() -> None:
    pm = _manager()
    stream = pm.track(
        "s",
        _spec(),
        ProcessOrigin.EXEC,
        _events(ExecStarted("p-2"), ExecOutput(S.STDOUT, b"a", 0), ExecOutput(S.STDOUT, b"b", 1)),
    )
    assert isinstance(await anext(stream), ExecStarted)
    assert pm.get("s", "p-2").exited is None  # running: found by its id
    await stream.aclose()
    exited = pm.get("s", "p-2").exited
    assert exited is not None and exited.signal == "SIGKILL"


async def test_the_foreground_buffer_is_small_and_never_refuses_a_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(processes, "MAX_PROCESSES_PER_SESSION", 2)
    pm = _manager()
    for i in range(3):  # more than the limit: the oldest exited record makes room
        events = _events(ExecStarted(f"p-{i}"), ExecExited(0, "", False, False, 0.1))
        _ = [e async for e in pm.track("s", _spec(64 << 20), ProcessOrigin.EXEC, events)]
    assert [p.process_id for p in pm._by_session["s"].values()] == ["p-1", "p-2"]
    assert pm.get("s", "p-2").options.buffer_bytes == processes.FOREGROUND_BUFFER_BYTES


async def test_stdin_calls_on_a_process_without_open_stdin() -> None:
    pm = _manager()
    events = _events(ExecStarted("p-9"), ExecOutput(S.STDOUT, b"x", 0))
    stream = pm.track("s", _spec(), ProcessOrigin.INTERACT, events)
    await anext(stream)
    with pytest.raises(FailedPrecondition) as exc:
        await pm.send_input("s", "p-9", b"more")
    assert exc.value.reason == "STDIN_CLOSED"
    with pytest.raises(FailedPrecondition):
        await pm.close_stdin("s", "p-9")  # not a background process: its stdin is not ours
    await stream.aclose()
    with pytest.raises(FailedPrecondition) as exc:
        await pm.send_input("s", "p-9", b"more")
    assert exc.value.reason == "PROCESS_EXITED"
    bg = BackgroundProcess("s", "bg", _spec())
    pm._by_session["s"]["bg"] = bg
    await pm.close_stdin("s", "bg")  # a background process whose stdin is closed: a no-op


class _NeverStarts:
    """An executor whose command never gets going (its sandbox is being removed)."""

    detached = None

    def start(
        self, *args: object, **kwargs: object
    ) -> contextlib.AbstractAsyncContextManager[None]:
        @contextlib.asynccontextmanager
        async def hang() -> AsyncIterator[None]:
            await asyncio.Event().wait()
            yield

        return hang()


async def test_a_start_racing_the_sessions_end_is_answered() -> None:
    """Found by the fuzzer in CI: DeleteSession racing StartProcess cancelled the start, and the
    StartProcess call got no answer until its deadline. It is SESSION_NOT_RUNNING now."""
    pm = ProcessManager(executor=_NeverStarts())  # type: ignore[arg-type]
    session = _session()
    start = asyncio.create_task(pm.start(session, _spec(), "p-1"))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    await pm.end_session("s")
    with pytest.raises(FailedPrecondition) as info:
        await asyncio.wait_for(start, 5)
    assert info.value.reason == "SESSION_NOT_RUNNING"


class _RecordsDetach:
    """An executor that notes what a start asks of the agent, then fails the start."""

    detached = None

    def __init__(self) -> None:
        self.detach: object = None

    def start(
        self, *args: object, detach: object = None, **kwargs: object
    ) -> contextlib.AbstractAsyncContextManager[None]:
        self.detach = detach

        @contextlib.asynccontextmanager
        async def refused() -> AsyncIterator[None]:
            raise Unavailable("the engine went away")
            yield

        return refused()


@pytest.mark.parametrize(
    ("memory", "workspace", "isolation", "budget"),
    [
        (256 << 20, 64 << 20, Isolation.RUNC, 128 << 20),  # half
        (256 << 20, 64 << 20, Isolation.GVISOR, 64 << 20),  # a quarter: the Sentry's share
        (128 << 20, 64 << 20, Isolation.RUNC, 32 << 20),  # the workspace full and a quarter
    ],
)
async def test_the_agent_is_given_its_budget_for_all_its_rings(
    memory: int, workspace: int, isolation: Isolation, budget: int
) -> None:
    """Without a budget the agent's rings of running processes grew until the agent was
    OOM-killed with its sandbox (helper/agent.h, DEFAULT_RING_BUDGET); at half the memory a
    full workspace left the agent the OOM killer's only choice (SECURITY.md, "Memory of the
    agent")."""
    executor = _RecordsDetach()
    pm = ProcessManager(executor=executor)  # type: ignore[arg-type]
    with pytest.raises(Unavailable):
        await pm.start(_session(memory, workspace, isolation), _spec(), "p-1")  # type: ignore[arg-type]
    assert isinstance(executor.detach, Detach)
    assert executor.detach.budget_bytes == budget


def _session(
    memory: int = 256 << 20, workspace: int = 64 << 20, isolation: Isolation = Isolation.RUNC
) -> types.SimpleNamespace:
    limits = types.SimpleNamespace(memory_bytes=memory, workspace_bytes=workspace, pids=64)
    # A memory workspace: its tmpfs is the sandbox's memory (SessionSpec.memory_workspace_bytes).
    spec = types.SimpleNamespace(
        limits=limits, isolation=isolation, memory_workspace_bytes=workspace
    )
    return types.SimpleNamespace(session_id="s", tenant="alpha", container_id="c", spec=spec)


class _Faulty:
    """An executor with a fault of ours (not a SandboxError) in its start."""

    detached = None

    def start(self, *args: object, **kwargs: object) -> object:
        raise RuntimeError("a bug")


async def test_a_fault_in_a_start_is_answered_not_left_waiting() -> None:
    """A start that failed with anything but a SandboxError left StartProcess waiting until
    the session ended (found while adding the agent's ring budget: a test session without a
    spec)."""
    pm = ProcessManager(executor=_Faulty())  # type: ignore[arg-type]
    with pytest.raises(Internal) as info:
        await asyncio.wait_for(pm.start(_session(), _spec(), "p-1"), 5)  # type: ignore[arg-type]
    assert "a bug" in str(info.value)
