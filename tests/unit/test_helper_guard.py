"""The agent's guard over pipes, static and ASan builds (helper/agent_guard.c; SECURITY.md,
"Memory of the agent"): under gVisor the host's OOM killer takes the Sentry and its pids cgroup
counts the Sentry's threads, so the agent itself kills the largest command before the sandbox's
memory is full and refuses commands past the session's pids. The sandbox's meminfo is a file of
the test's here (HELLO's `guard.meminfo`), written to say how full the sandbox is.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_pipes import AgentProcess, Helper, running_agent  # noqa: E402
from agent_wire import EXIT, OPEN_OK, RESET, Frame, output  # noqa: E402

SH = shutil.which("sh") or "/bin/sh"
PY = sys.executable
SLEEP = shutil.which("sleep") or "/bin/sleep"
MiB = 1 << 20
MEMORY = 1024 * MiB  # the guard's limit; its kill line is 1/16 below (64 MiB)


@pytest.fixture
def agent(agent_helper: Helper, tmp_path: Path) -> Iterator[AgentProcess]:
    with running_agent(agent_helper, tmp_path) as a:
        yield a


Procs = dict[str, dict[str, Any]]


def _meminfo(path: Path, used: int) -> None:
    """A meminfo of MEMORY with `used` bytes in use (written whole, then renamed)."""
    tmp = path.with_suffix(".tmp")
    free = (MEMORY - used) // 1024
    tmp.write_text(f"MemTotal: {MEMORY // 1024} kB\nMemFree: {free} kB\nMemAvailable: {free} kB\n")
    tmp.rename(path)


def _guard(path: Path, pids: int = 0) -> dict[str, object]:
    """HELLO's guard: no Sentry share (the test's meminfo says all), the kill line 64 MiB
    below MEMORY (1/16 of it)."""
    return {"memory": MEMORY, "sentry": 0, "task": 0, "pids": pids, "meminfo": str(path)}


def _procs(a: AgentProcess, guard: dict[str, object] | None) -> Procs:
    """The detached processes by id, from a HELLO_OK (HELLO says the guard again, as the
    server's every HELLO does)."""
    hello = a.hello(guard=guard) if guard else a.hello()
    return {p["id"]: p for p in hello.json()["processes"]}


def _start(a: AgentProcess, name: str, argv: list[str]) -> Frame:
    """A detached start's answer: OPEN_OK, or the RESET that refused it."""
    sid = a.open("exec", argv=argv, env={"PATH": "/usr/bin:/bin"}, detach={"id": name})
    return a.read_until(lambda f: f.stream == sid and f.type in (OPEN_OK, RESET))[-1]


def _ended(a: AgentProcess, guard: dict[str, object], n: int) -> Procs:
    """The ended processes, once `n` have."""
    deadline = time.monotonic() + 20
    while True:
        ended = {k: p for k, p in _procs(a, guard).items() if not p["running"]}
        if len(ended) >= n:
            return ended
        assert time.monotonic() < deadline, ended
        time.sleep(0.1)


def _back_when_gone(info: Path, pid: int) -> None:
    """The sandbox's use back below the line as soon as process `pid` is gone."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.002)
    _meminfo(info, 100 * MiB)


def _run(a: AgentProcess, script: str) -> list[Frame]:
    sid = a.open("exec", argv=[SH, "-c", script], env={"PATH": "/usr/bin:/bin"})
    return a.read_until(lambda f: f.stream == sid and f.type in (EXIT, RESET))


def test_past_the_line_the_largest_command_is_killed_not_the_agent(
    agent: AgentProcess, tmp_path: Path
) -> None:
    """Three commands, one holding 64 MiB: below the kill line nothing happens; past it the
    one holding most is SIGKILLed (signal 9, exit 137: as a kernel OOM kill under runc), the
    small ones and the agent go on, and the agent says so on its stderr."""
    info = tmp_path / "meminfo"
    _meminfo(info, 100 * MiB)
    guard = _guard(info)
    agent.hello(guard=guard)
    big = f"b = bytearray({64 * MiB}); import time; time.sleep(60)"
    assert _start(agent, "small1", [SH, "-c", "sleep 60"]).type == OPEN_OK
    assert _start(agent, "big", [PY, "-c", big]).type == OPEN_OK
    assert _start(agent, "small2", [SH, "-c", "sleep 60"]).type == OPEN_OK
    time.sleep(1.5)  # the big one holds its memory; below the line nothing is killed
    assert all(p["running"] for p in _procs(agent, guard).values())
    # past the line; the sandbox's memory comes back once the big one is gone, as in a
    # sandbox (within the agent's GUARD_SETTLE_MS, before it would take another)
    pid = int(_procs(agent, guard)["big"]["pid"])
    back = threading.Thread(target=_back_when_gone, args=(info, pid), daemon=True)
    back.start()
    _meminfo(info, MEMORY - 16 * MiB)
    back.join(20)
    time.sleep(0.5)
    ended = _ended(agent, guard, 1)
    assert list(ended) == ["big"], ended
    assert (ended["big"]["exit_code"], ended["big"]["signal"]) == (137, 9), ended
    procs = _procs(agent, guard)
    assert sorted(k for k, p in procs.items() if p["running"]) == ["small1", "small2"], procs
    assert output(_run(agent, "echo alive")) == b"alive\n"
    agent.close()
    assert "guard: sandbox at" in agent.stderr_text, agent.stderr_text


def test_past_the_line_a_start_is_refused_as_the_sandboxs_memory_limit(
    agent: AgentProcess, tmp_path: Path
) -> None:
    """Past the kill line with nothing left to kill (the sandbox's memory is the agent's or a
    file system's): a start is refused with LIMIT naming the memory limit; below it, started."""
    info = tmp_path / "meminfo"
    _meminfo(info, MEMORY - 8 * MiB)
    guard = _guard(info)
    agent.hello(guard=guard)
    refused = _run(agent, "echo no")[-1]
    assert refused.type == RESET
    doc = refused.json()
    assert doc["error"] == "LIMIT" and "memory limit" in doc["message"], doc
    _meminfo(info, MEMORY // 2)
    assert output(_run(agent, "echo yes")) == b"yes\n"


def test_past_the_pids_budget_a_start_is_refused_as_the_sandboxs_limit(
    agent: AgentProcess, tmp_path: Path
) -> None:
    """A guard of 4 pids: a command of three processes and one of one fill it; the next start
    is refused with LIMIT, naming the process limit, and nothing is killed for it; once one
    ends a start goes through again."""
    info = tmp_path / "meminfo"
    _meminfo(info, 100 * MiB)
    guard = _guard(info, pids=4)
    agent.hello(guard=guard)
    assert _start(agent, "three", [SH, "-c", "sleep 60 & sleep 60 & wait"]).type == OPEN_OK
    assert _start(agent, "one", [SLEEP, "60"]).type == OPEN_OK
    time.sleep(0.5)  # the shell forked its two
    refused = _start(agent, "five", [SLEEP, "60"])
    assert refused.type == RESET, refused
    doc = refused.json()
    assert doc["error"] == "LIMIT" and "process limit" in doc["message"], doc
    assert "4 of 4" in doc["message"], doc
    assert _run(agent, "true")[-1].type == RESET  # an attached one too
    procs = _procs(agent, guard)
    assert sorted(k for k, p in procs.items() if p["running"]) == ["one", "three"], procs
    os.kill(int(procs["one"]["pid"]), signal.SIGKILL)
    _ended(agent, guard, 1)
    frames = _run(agent, "echo room")
    assert output(frames) == b"room\n" and frames[-1].type == EXIT


def test_without_a_guard_nothing_is_counted(agent: AgentProcess, tmp_path: Path) -> None:
    """A later HELLO without `guard` (runc: its kernel's OOM killer and pids cgroup end a
    command alone) turns it off: a full meminfo and processes past its pids change nothing."""
    info = tmp_path / "meminfo"
    _meminfo(info, MEMORY)
    agent.hello(guard=_guard(info, pids=1))
    agent.hello()
    for i in range(3):
        assert _start(agent, f"s{i}", [SLEEP, "60"]).type == OPEN_OK
    time.sleep(0.5)
    assert all(p["running"] for p in _procs(agent, None).values())
