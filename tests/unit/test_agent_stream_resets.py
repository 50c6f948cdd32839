"""What a reader of an agent stream is told when the agent resets it: each RESET the agent
sends (docs/agent.md) reaches the caller as a refusal that says what happened, never as an
internal error of the server."""

from __future__ import annotations

import pytest
from sandboxd.agent.streams import AgentStream
from sandboxd.errors import NotFound, ResourceExhausted, SandboxError
from sandboxd.reasons import Reason


async def _reset(error: str, message: str) -> SandboxError:
    stream = AgentStream(3, "attach", window=1024, send=lambda _f: None, send_now=lambda _f: None)
    stream.on_open_ok({})
    stream.on_reset({"error": error, "message": message})
    with pytest.raises(SandboxError) as got:
        await stream.read()
    return got.value


async def test_a_process_forgotten_under_its_reader_is_not_found() -> None:
    """A storm of starts drops the oldest exited records for room, readers or not: the agent
    resets their streams with GONE, which the caller gets as PROCESS_NOT_FOUND (an outside
    flood saw INTERNAL)."""
    err = await _reset("GONE", "the detached process was forgotten")
    assert isinstance(err, NotFound) and err.reason == Reason.PROCESS_NOT_FOUND
    assert "made room for newer processes" in str(err)


async def test_a_stream_past_the_agents_memory_is_resource_exhausted() -> None:
    err = await _reset("MEMORY", "input past the agent's budget")
    assert isinstance(err, ResourceExhausted)
