"""A stream's stdin written as runs of DATA frames (frames.data_run): the same frames on the
wire as one `frames.data` per MAX_PAYLOAD, never more than the agent's window allows, and at
most `SEND_RUN` bytes per item handed to the channel's writer."""

from __future__ import annotations

import asyncio
import os

import pytest
from sandboxd.agent import frames
from sandboxd.agent.frames import FrameDecoder, FrameType
from sandboxd.agent.streams import SEND_RUN, AgentStream

STEP = frames.MAX_PAYLOAD - 1


def decode(wire: bytes) -> list[frames.Frame]:
    decoder = FrameDecoder()
    decoder.feed(wire)
    out = []
    while (frame := decoder.next()) is not None:
        out.append(frame)
    assert decoder.buffered == 0
    return out


@pytest.mark.parametrize("size", [0, 1, STEP - 1, STEP, STEP + 1, 3 * STEP, 3 * STEP + 7])
def test_a_run_is_the_frames_one_data_each_would_make(size: int) -> None:
    payload = os.urandom(size)
    view = memoryview(payload)
    one_each = b"".join(frames.data(9, 0, view[i : i + STEP]) for i in range(0, max(size, 1), STEP))
    assert frames.data_run(9, 0, view) == one_each
    got = decode(frames.data_run(9, 0, view))
    assert all(f.type == FrameType.DATA and f.stream == 9 for f in got)
    assert all(len(f.payload) <= frames.MAX_PAYLOAD for f in got)
    assert b"".join(f.payload[1:] for f in got) == payload


async def test_write_sends_runs_within_the_window_and_the_run_size() -> None:
    sent: list[bytes] = []

    async def send(item: bytes) -> None:
        sent.append(item)

    window = 300_000  # past SEND_RUN: runs cut by both
    stream = AgentStream(3, "exec", window=window, send=send, send_now=lambda _: None)
    stream.opened.set_result({})
    data = os.urandom(1024 * 1024)
    writer = asyncio.create_task(stream.write(0, data))
    delivered = 0
    while not writer.done():
        await asyncio.sleep(0)
        wire = b"".join(sent)
        moved = sum(len(f.payload) - 1 for f in decode(wire))
        assert moved <= window + delivered  # never past what the agent granted
        if moved == window + delivered and not writer.done():
            stream.on_window(window)  # the agent took it all: grant as much again
            delivered += window
    await writer
    got = [decode(item) for item in sent]
    assert all(sum(len(f.payload) - 1 for f in run) <= SEND_RUN for run in got)
    assert b"".join(f.payload[1:] for run in got for f in run) == data
