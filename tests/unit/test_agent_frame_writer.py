"""FrameWriter (agent/transport.py): a DATA frame sent while nothing is queued is written by its
sender (no wake-up of the writer task on a keystroke's way), without breaking the one FIFO,
the control frames that never wait, or the end of the channel when the pipe breaks."""

from __future__ import annotations

import asyncio

import pytest
from sandboxd.agent.transport import FrameWriter


class _Pipe:
    """Records each write; `gate` (when set) holds a write until opened, like a full pipe."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.gate: asyncio.Event | None = None
        self.broken: Exception | None = None

    async def read(self) -> bytes | None:
        return None

    async def write(self, data: bytes) -> None:
        if self.broken is not None:
            raise self.broken
        self.writes.append(data)
        if self.gate is not None:
            await self.gate.wait()

    async def close(self) -> None:
        pass


async def test_a_frame_sent_to_an_idle_writer_is_written_by_its_sender() -> None:
    pipe = _Pipe()
    writer = FrameWriter(pipe)
    task = asyncio.create_task(writer.run())
    try:
        await writer.send(b"one")
        assert pipe.writes == [b"one"]  # already written: no turn of the writer task needed
    finally:
        task.cancel()


async def test_frames_sent_during_a_held_write_follow_it_in_order() -> None:
    pipe = _Pipe()
    pipe.gate = asyncio.Event()
    writer = FrameWriter(pipe)
    task = asyncio.create_task(writer.run())
    try:
        first = asyncio.create_task(writer.send(b"a"))
        await asyncio.sleep(0)
        assert pipe.writes == [b"a"]  # held in the transport
        writer.send_now(b"W")  # a control frame never waits
        second = asyncio.create_task(writer.send(b"b"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert pipe.writes == [b"a"]  # nothing overtakes or joins the write under way
        assert second.done()  # queued behind it
        pipe.gate.set()
        await first
        for _ in range(5):
            await asyncio.sleep(0)
        assert pipe.writes == [b"a", b"Wb"]  # the task wrote the rest, in order, as one batch
    finally:
        task.cancel()


async def test_a_cancelled_sender_hands_what_queued_meanwhile_to_the_task() -> None:
    pipe = _Pipe()
    pipe.gate = asyncio.Event()
    writer = FrameWriter(pipe)
    task = asyncio.create_task(writer.run())
    try:
        first = asyncio.create_task(writer.send(b"a"))
        await asyncio.sleep(0)
        writer.send_now(b"W")
        pipe.gate = None  # the next writes go through (the held one stays held)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        for _ in range(5):
            await asyncio.sleep(0)
        assert pipe.writes == [b"a", b"W"]
        await writer.send(b"c")
        assert pipe.writes == [b"a", b"W", b"c"]
    finally:
        task.cancel()


async def test_a_broken_pipe_fails_the_sender_and_ends_the_writer_task() -> None:
    pipe = _Pipe()
    pipe.broken = ConnectionError("pipe closed")
    writer = FrameWriter(pipe)
    task = asyncio.create_task(writer.run())
    with pytest.raises(ConnectionError):
        await writer.send(b"a")
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(task, 1)  # the channel's writer task ends: the channel closes
    with pytest.raises(ConnectionError, match="closed"):
        await writer.send(b"b")
