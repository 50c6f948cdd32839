"""The agent's memory over pipes, static and ASan builds (SECURITY.md, "Memory of the agent";
docs/agent.md, "Memory"): the OOM killer's ordering, and every buffer the agent holds reserved
against its budget before it is touched, also when starts race.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_pipes import AgentProcess, Helper, running_agent  # noqa: E402
from agent_wire import EXIT, OPEN, OPEN_OK, RESET, data, encode_json, output  # noqa: E402
from conftest import rss_bytes  # noqa: E402

SH = shutil.which("sh") or "/bin/sh"
FLOOR = 64 << 10  # RING_FLOOR: each ring's first bytes, outside the budget
MiB = 1 << 20


@pytest.fixture
def agent(agent_helper: Helper, tmp_path: Path) -> Iterator[AgentProcess]:
    with running_agent(agent_helper, tmp_path) as a:
        yield a


def _run(a: AgentProcess, script: str) -> bytes:
    sid = a.open("exec", argv=[SH, "-c", script], env={"PATH": "/usr/bin:/bin"})
    return output(a.stream_frames(sid))


def _processes(a: AgentProcess) -> list[dict[str, object]]:
    procs: list[dict[str, object]] = a.hello().json()["processes"]
    return procs


def _wait_written(a: AgentProcess, n: int, size: int) -> list[dict]:  # type: ignore[type-arg]
    deadline = time.monotonic() + 30
    while True:
        procs = _processes(a)
        if len(procs) == n and all(p["end"]["1"] == size for p in procs):  # type: ignore[index]
            return procs
        assert time.monotonic() < deadline, procs
        time.sleep(0.05)


def _opened(a: AgentProcess, n: int) -> int:
    """Reads until `n` streams answered their OPEN; how many of them were OPEN_OK."""
    answers = {}
    deadline = time.monotonic() + 30
    while len(answers) < n:
        f = a.read(max(0.01, deadline - time.monotonic()))
        if f.type in (OPEN_OK, RESET) and f.stream not in answers:
            answers[f.stream] = f.type
    return sum(t == OPEN_OK for t in answers.values())


def test_every_command_scores_above_the_agent(agent: AgentProcess) -> None:
    """A command's oom_score_adj is 1000, the most, so the memory cgroup's OOM killer scores
    it above the agent whatever the agent holds (at 500 the agent's rings, half the sandbox,
    outscored a small command, and the agent was the victim). The agent keeps its own."""
    agent.hello()
    own = Path(f"/proc/{agent.proc.pid}/oom_score_adj").read_text()
    assert int(own) < 1000
    assert _run(agent, "cat /proc/self/oom_score_adj") == b"1000\n"
    # a detached process too, and what it starts inherits it
    agent.open(
        "exec", argv=[SH, "-c", "sh -c 'cat /proc/self/oom_score_adj'"], env={}, detach={"id": "d"}
    )
    assert agent.read().type == OPEN_OK
    deadline = time.monotonic() + 10
    while not [p for p in _processes(agent) if not p["running"]]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    att = agent.open("attach", id="d", offsets={"1": 0, "2": 0})
    assert output(agent.stream_frames(att)) == b"1000\n"
    assert Path(f"/proc/{agent.proc.pid}/oom_score_adj").read_text() == own


def test_racing_detached_starts_past_the_budget_wrap_within_it(
    agent: AgentProcess, agent_helper: Helper
) -> None:
    """Forty detached writers of 1 MB started in one write (every OPEN before any output is
    read), with rings of 1 MiB and a budget of 4 MiB for all: what the rings hold past their
    floors stays within the budget to the byte, each ring's growth reserved before its read.
    Every process started; the ones stopped by the budget keep their newest output. (The
    earlier ring budget held this too, within a chunk per ring: a regression test.)"""
    agent.hello()
    base = rss_bytes(agent.proc.pid)
    n, size, budget = 40, 1_000_000, 4 * MiB
    raw = b""
    for i in range(n):
        raw += encode_json(
            OPEN,
            agent.open_id(),
            {
                "kind": "exec",
                "argv": [SH, "-c", f"head -c {size} /dev/zero; sleep 60"],
                "env": {},
                "detach": {"id": f"w{i}", "buffer": MiB, "budget": budget},
            },
        )
    agent.send(raw)
    assert _opened(agent, n) == n
    procs = _wait_written(agent, n, size)
    held = [p["end"]["1"] - p["start"]["1"] for p in procs]  # type: ignore[index, operator]
    past_floors = sum(max(0, h - FLOOR) for h in held)
    assert past_floors <= budget, (past_floors, held)
    assert sum(held) <= budget + n * FLOOR, held
    assert any(p["start"]["1"] > 0 for p in procs)  # type: ignore[index, operator]
    if not agent_helper.asan:  # the sanitizer's own allocator has its own overheads
        growth = rss_bytes(agent.proc.pid) - base
        assert growth < budget + n * FLOOR + 2 * MiB, f"the agent grew by {growth} bytes"
    assert _run(agent, "echo ok") == b"ok\n"


def test_forgotten_output_gives_its_memory_back(agent: AgentProcess) -> None:
    """Rings of 8 MiB filled and forgotten, ten times over: the agent's memory is back where
    it was. Before, the glibc heap kept the freed rings resident once its threshold had grown
    past their size (the sanitizer's allocator held them in its quarantine): the agent held
    what it no longer counted, and repeated starts grew it past its budget."""
    agent.hello()
    size = 8_000_000
    _run(agent, "true")
    base = rss_bytes(agent.proc.pid)
    for i in range(10):
        agent.open(
            "exec",
            argv=[SH, "-c", f"head -c {size} /dev/zero"],
            env={},
            detach={"id": f"f{i}", "buffer": 8 * MiB},
        )
        assert agent.read().type == OPEN_OK
        deadline = time.monotonic() + 30
        while True:
            procs = _processes(agent)
            if procs and not procs[0]["running"] and procs[0]["end"]["1"] == size:  # type: ignore[index]
                break
            assert time.monotonic() < deadline, procs
            time.sleep(0.02)
        agent.open("forget", id=f"f{i}")
        agent.read_until(lambda f: f.type != OPEN_OK)  # OPEN_OK then CLOSE
    assert _processes(agent) == []
    growth = rss_bytes(agent.proc.pid) - base
    assert growth < 2 * MiB, f"the agent still holds {growth} bytes"


def test_input_past_the_budget_ends_its_stream_not_the_agent(agent: AgentProcess) -> None:
    """Commands that do not read their stdin while the server sends it: what waits in the
    agent is reserved against HELLO's budget (1 MiB here), and a stream whose input would pass
    it is reset `MEMORY` (its command ended) instead of the agent buffering a window per stream
    (1024 streams of a 1 MiB window each: 1 GiB). The others and the agent go on."""
    agent.hello(window=MiB, budget=MiB)
    sids = [agent.open("exec", argv=["/bin/sleep", "60"], env={}, stdin=True) for _ in range(4)]
    assert _opened(agent, len(sids)) == len(sids)
    for sid in sids:
        for _ in range(8):  # 512 KiB each, within the window; the pipe takes 64 KiB
            agent.send(data(sid, b"x" * 65535))
    frames = agent.quiet(1.0)
    resets = [f for f in frames if f.type == RESET]
    assert resets and all(f.json()["error"] == "MEMORY" for f in resets), frames
    assert len(resets) < len(sids)  # the budget held what it could
    assert not [f for f in frames if f.type == EXIT and f.stream not in {r.stream for r in resets}]
    assert _run(agent, "echo ok") == b"ok\n"
