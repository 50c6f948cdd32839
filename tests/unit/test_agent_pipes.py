"""The harness of the real agent over pipes (tests/agent_pipes.py) fails a test on a sanitizer
report: both ways of starting the agent, with a stand-in that writes such a report to its
stderr (the sanitizer build of the agent, which has none to write, could not show that the
check is not vacuous)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from agent_pipes import SANITIZER_MARKS, AgentProcess, Helper, agent_process

REPORTS = {
    "AddressSanitizer": "==1==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x1",
    "runtime error:": "agent.c:10:5: runtime error: signed integer overflow",
    "LeakSanitizer": "==1==ERROR: LeakSanitizer: detected memory leaks",
    "UndefinedBehavior": "SUMMARY: UndefinedBehaviorSanitizer: undefined-behavior agent.c:10:5",
}


def _reporting(tmp_path: Path, report: str) -> Helper:
    """A stand-in for `sbx agent` that writes `report` to stderr, then echoes its input."""
    script = tmp_path / "sbx"
    script.write_text(f"#!/bin/sh\necho '{report}' >&2\nexec cat\n")
    script.chmod(0o755)
    return Helper(script, asan=True)


def test_every_mark_has_a_report() -> None:
    assert set(REPORTS) == set(SANITIZER_MARKS)


@pytest.mark.parametrize("mark", SANITIZER_MARKS)
def test_a_report_fails_the_synchronous_agent(tmp_path: Path, mark: str) -> None:
    a = AgentProcess(_reporting(tmp_path, REPORTS[mark]), tmp_path)
    with pytest.raises(AssertionError, match=mark):
        a.close()
    assert a.close() == 0  # closed once: the second close only reaps


@pytest.mark.parametrize("mark", SANITIZER_MARKS)
async def test_a_report_fails_the_asyncio_agent(tmp_path: Path, mark: str) -> None:
    with pytest.raises(AssertionError, match=mark):
        async with agent_process(_reporting(tmp_path, REPORTS[mark]), tmp_path) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(b"ping")
            assert await asyncio.wait_for(proc.stdout.readexactly(4), 5) == b"ping"


async def test_a_clean_stderr_passes(tmp_path: Path) -> None:
    async with agent_process(_reporting(tmp_path, "agent: listening"), tmp_path):
        pass
    a = AgentProcess(_reporting(tmp_path, "agent: listening"), tmp_path)
    assert a.close() == 0
    assert a.stderr_text == "agent: listening\n"
