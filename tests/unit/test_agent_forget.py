"""`forget` of a detached process (docs/agent.md) with a reader still attached to it: the
reader's stream is reset (`GONE`), never dropped without a word (its reader would wait for
output that never comes). The real agent, static and ASan/UBSan."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_pipes import AgentProcess, Helper, running_agent
from agent_wire import CLOSE, DATA, EXIT, OPEN_OK, RESET, window


@pytest.fixture
def agent(agent_helper: Helper, tmp_path: Path) -> Iterator[AgentProcess]:
    with running_agent(agent_helper, tmp_path) as a:
        yield a


def test_forget_resets_the_streams_still_attached(agent: AgentProcess) -> None:
    agent.hello()  # windows of 256 KiB
    sid = agent.open(
        "exec",
        argv=["/bin/sh", "-c", "head -c 1000000 /dev/zero"],
        env={"PATH": "/usr/bin:/bin"},
        detach={"id": "f", "buffer": 2000000},
    )
    frames = agent.stream_frames(sid)  # all of it, then EXIT: the process has ended
    assert frames[-1].type == EXIT
    att = agent.open("attach", id="f", offsets={"1": 0, "2": 0})
    got = agent.read_until(lambda f: f.stream == att and f.type == DATA)
    assert got[0].type == OPEN_OK  # a reader that got some output, and no window back
    forget = agent.open("forget", id="f")
    got = agent.read_until(lambda f: f.stream == forget and f.type == CLOSE)
    resets = [f for f in got if f.stream == att and f.type == RESET]
    assert [f.json()["error"] for f in resets] == ["GONE"], got
    assert [f.type for f in got if f.stream == forget] == [OPEN_OK, CLOSE]
    agent.send(window(att, 1 << 20))  # late: the agent ignores a stream it ended
    assert agent.quiet(0.2) == []
