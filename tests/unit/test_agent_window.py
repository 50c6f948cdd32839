"""The inbound window's auto-tuning (service/sandboxd/agent/streams.py): a stream whose reader
keeps up grows its window (a WINDOW increment larger than what was consumed) up to `window_max`
and never past it; a slow or stalled reader keeps the configured window, so what waits unread
in the server stays bounded by it; a hostile agent still gets FLOW_CONTROL for DATA past the
grown window. Against a scripted agent, and against the real agent (static and ASan), which
takes the larger increments and sends into them."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import agent_wire as w
import pytest
from agent_peer import ScriptedAgent
from agent_pipes import CHANNEL_ENV, PipeTransport
from sandboxd.agent import byte_stream, streams
from sandboxd.agent.channel import Channel
from sandboxd.agent.exec_stream import AgentExec, exec_request
from sandboxd.agent.router import agent_settings
from sandboxd.config import load_config
from sandboxd.errors import ConfigError, SandboxError
from sandboxd.reasons import Reason

WINDOW = 4096
WINDOW_MAX = 4 * WINDOW
ENV = CHANNEL_ENV


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Growth judged by the unread bytes only (a loaded test machine is never 'too slow')."""
    monkeypatch.setattr(streams, "GROW_WITHIN_S", 60.0)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[ScriptedAgent, Channel]]:
    agent = ScriptedAgent()
    channel = Channel(
        agent.transport,  # type: ignore[arg-type]
        name="window",
        window=WINDOW,
        window_max=WINDOW_MAX,
        handshake_s=2.0,
        resend_s=0.05,
    )
    starting = asyncio.create_task(channel.start())
    await agent.handshake()
    await starting
    yield agent, channel
    await channel.close()


async def start_exec(agent: ScriptedAgent, channel: Channel) -> tuple[int, AgentExec]:
    request = exec_request(("/bin/yes",), base_env={}, env={}, workdir=None, stdin=False, tty=False)
    opening = asyncio.create_task(channel.open("exec", request))
    sid, _ = await agent.accept_open()
    stream = await opening
    return sid, AgentExec(channel, stream, f"agent-w-{sid}", 42)


async def granted(agent: ScriptedAgent, sid: int) -> int:
    """The WINDOW increments the agent has received for `sid` since the last call."""
    for _ in range(5):
        await asyncio.sleep(0)  # the server's writer task delivers what it queued
    return sum(
        int.from_bytes(f.payload, "big")
        for f in agent.pending()
        if f.type == w.WINDOW and f.stream == sid
    )


async def pump(agent: ScriptedAgent, ex: AgentExec, sid: int, total: int) -> tuple[int, int]:
    """As a sender bound by its credit: fill whatever window the server gave, while the reader
    takes each chunk at once. Returns (bytes moved, the largest credit the agent ever held)."""
    credit, moved, most = WINDOW, 0, WINDOW
    while moved < total:
        n = min(credit, total - moved, 1024)
        if n:
            agent.output(sid, b"b" * n)
            credit -= n
            moved += n
        got = await asyncio.wait_for(ex.read(), 2)
        assert got is not None
        credit += await granted(agent, sid)
        most = max(most, credit)
    return moved, most


# ----- the server's side against a scripted agent ----------------------------------------------


@pytest.mark.usefixtures("patient")
async def test_a_reader_that_keeps_up_grows_the_window_to_the_cap_only(
    pair: tuple[ScriptedAgent, Channel],
) -> None:
    agent, channel = pair
    sid, ex = await start_exec(agent, channel)
    moved, most = await pump(agent, ex, sid, 20 * WINDOW_MAX)
    stream = ex._stream
    assert stream._window == WINDOW_MAX  # grew, and stopped at the cap
    assert WINDOW < most <= WINDOW_MAX  # the agent never held more credit than the cap
    # DATA of the whole grown window is taken; one byte more is the peer's bug, as before.
    agent.exit(sid)
    assert moved == 20 * WINDOW_MAX


@pytest.mark.usefixtures("patient")
async def test_data_past_the_grown_window_is_still_flow_control(
    pair: tuple[ScriptedAgent, Channel],
) -> None:
    agent, channel = pair
    sid, ex = await start_exec(agent, channel)
    await pump(agent, ex, sid, 10 * WINDOW_MAX)
    credit = ex._stream._credit
    assert credit > WINDOW  # the agent may now send more than the configured window
    agent.output(sid, b"x" * credit)
    agent.output(sid, b"x")
    reset = await agent.recv_type(w.RESET)
    assert reset.stream == sid and reset.json()["error"] == "FLOW_CONTROL"
    with pytest.raises(SandboxError) as caught:
        while await asyncio.wait_for(ex.read(), 2) is not None:
            pass
    assert caught.value.reason == Reason.AGENT_PROTOCOL_ERROR


@pytest.mark.parametrize("increment", [0, 2**31 - 1])
async def test_bad_window_increments_still_reset_the_stream(
    pair: tuple[ScriptedAgent, Channel], increment: int
) -> None:
    agent, channel = pair
    sid, _ = await start_exec(agent, channel)
    agent.send(w.window(sid, increment))
    reset = await agent.recv_type(w.RESET)
    assert reset.stream == sid and reset.json()["error"] == "FLOW_CONTROL"


@pytest.mark.usefixtures("patient")
async def test_a_stalled_reader_holds_one_window_and_never_grows(
    pair: tuple[ScriptedAgent, Channel],
) -> None:
    agent, channel = pair
    sid, ex = await start_exec(agent, channel)
    # A reader slower than the sender: the agent refills its credit at once, so each grant
    # finds half a window still unread and the window stays as configured.
    credit = WINDOW
    for _ in range(16):
        while credit:
            agent.output(sid, b"s" * 1024)
            credit -= 1024
        got = await asyncio.wait_for(ex.read_joined(WINDOW // 2), 2)
        assert got is not None and len(got[1]) == WINDOW // 2
        credit += await granted(agent, sid)
        assert credit <= WINDOW // 2
    assert ex._stream._window == WINDOW
    assert ex._stream._credit == credit  # granted exactly what was consumed, never more
    # And a reader that stops: the agent can never put more than the window in the server.
    agent.output(sid, b"s" * credit)
    agent.output(sid, b"s")
    reset = await agent.recv_type(w.RESET)
    assert reset.json()["error"] == "FLOW_CONTROL"


async def test_a_reader_slower_than_the_grant_interval_never_grows(
    pair: tuple[ScriptedAgent, Channel], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams, "GROW_WITHIN_S", 0.0)
    agent, channel = pair
    sid, ex = await start_exec(agent, channel)
    _, most = await pump(agent, ex, sid, 8 * WINDOW)
    assert ex._stream._window == WINDOW and most == WINDOW


async def test_no_cap_above_the_window_means_no_growth(patient: None) -> None:
    agent = ScriptedAgent()
    channel = Channel(agent.transport, name="fixed", window=WINDOW)  # type: ignore[arg-type]
    starting = asyncio.create_task(channel.start())
    await agent.handshake()
    await starting
    sid, ex = await start_exec(agent, channel)
    _, most = await pump(agent, ex, sid, 8 * WINDOW)
    assert ex._stream._window == WINDOW and most == WINDOW
    await channel.close()


@pytest.mark.usefixtures("patient")
async def test_a_byte_stream_grows_while_its_protocol_keeps_up(
    pair: tuple[ScriptedAgent, Channel],
) -> None:
    agent, channel = pair
    opening = asyncio.create_task(
        channel.open("dial", {"port": 80}, cls=byte_stream.ByteStream, fds=frozenset({0}))
    )
    sid, _ = await agent.accept_open()
    stream = await opening
    assert isinstance(stream, byte_stream.ByteStream)
    reader, writer = byte_stream.open_stream_pair(stream)
    credit, moved = WINDOW, 0
    while moved < 16 * WINDOW_MAX:
        n = min(credit, 1024)
        if n:
            agent.output(sid, b"d" * n, fd=0)
            credit -= n
            moved += n
        await reader.readexactly(n)
        await asyncio.sleep(0)
        credit += await granted(agent, sid)
        assert credit <= WINDOW_MAX
    assert stream.window == WINDOW_MAX
    writer.close()


# ----- the real agent (static and ASan) takes the larger increments ----------------------------


@pytest.mark.usefixtures("patient")
async def test_the_real_agent_sends_into_a_grown_window(
    piped_agent: asyncio.subprocess.Process, tmp_path: Path
) -> None:
    channel = Channel(
        PipeTransport(piped_agent),  # type: ignore[arg-type]
        name="real",
        window=65536,
        window_max=1 << 20,
    )
    await asyncio.wait_for(channel.start(), 10)
    blob = tmp_path / "ws" / "blob"
    payload = os.urandom(8 << 20)
    blob.write_bytes(payload)
    req = exec_request(
        ("/bin/cat", str(blob)), base_env=ENV, env={}, workdir=None, stdin=False, tty=False
    )
    stream = await channel.open("exec", req)
    ex = AgentExec(channel, stream, "agent-real-w", stream.opened.result()["pid"])
    digest, size = hashlib.sha256(), 0
    while (chunk := await asyncio.wait_for(ex.read(), 20)) is not None:
        assert chunk[0] == 1, chunk[1][:300]
        digest.update(chunk[1])
        size += len(chunk[1])
    assert size == len(payload) and digest.digest() == hashlib.sha256(payload).digest()
    assert await ex.wait_exit_code() == 0
    assert stream._window == 1 << 20  # it grew (and the agent used it: the bytes are whole)
    await channel.close()


# ----- the setting -------------------------------------------------------------------------------


def test_agent_window_max_reaches_the_channels() -> None:
    config = load_config(
        [], {"SANDBOXD_AGENT_WINDOW_MAX": "2MiB", "SANDBOXD_AGENT_WINDOW": "64KiB"}
    )
    settings = agent_settings(config)
    assert settings is not None
    assert (settings.window, settings.window_max) == (64 << 10, 2 << 20)
    assert agent_settings(load_config([], {})).window_max == 8 << 20  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="agent_window_max"):
        load_config([], {"SANDBOXD_AGENT_WINDOW_MAX": "1GiB"})  # bounded: 64 MiB at most
