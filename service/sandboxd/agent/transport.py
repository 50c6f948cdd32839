"""What the channel needs of a byte pipe to the agent, and its one writer.

The Docker adapter implements `Transport` over the container's attached stdio
(`engine/docker_attach.py`); the unit tests over an in-memory pipe. The channel never imports
Docker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Protocol


class Transport(Protocol):
    async def read(self) -> bytes | None:
        """The next chunk the agent wrote to its stdout; None once the pipe has ended."""
        ...

    async def write(self, data: bytes) -> None:
        """Write to the agent's stdin; returns once the bytes are handed on (backpressure)."""
        ...

    async def close(self) -> None: ...


class WritesNow(Protocol):
    """A transport that can also write without waiting (optional: the writer then skips its
    task for a frame sent while nothing is queued)."""

    def write_now(self, data: bytes) -> bool:
        """Hand `data` on at once and True, if that needs no wait; else False, nothing sent."""
        ...


class WriterOverflow(Exception):
    """More control frames queued than the bound: the peer is not reading (the epoch ends)."""


class FrameWriter:
    """The channel's single writer: one FIFO of encoded frames, one task that writes them.

    Streams' DATA waits for room (`send`); frames the reader must answer with (PONG, WINDOW,
    RESET) never wait (`send_now`): the reader must never block on a peer that does not read
    its stdin while it waits for us to read its stdout. Those are bounded in count instead.
    """

    def __init__(
        self, transport: Transport, *, max_bytes: int = 1 << 20, max_urgent: int = 4096
    ) -> None:
        self._transport = transport
        self._queue: collections.deque[tuple[bytes, bool]] = collections.deque()
        self._bytes = 0
        self._urgent = 0
        self._max_bytes = max_bytes
        self._max_urgent = max_urgent
        self._pending = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._failed: BaseException | None = None
        self._writing = False  # the writer task is in a write (its batch is not all sent)
        self._write_now = getattr(transport, "write_now", None)

    def send_now(self, frame: bytes) -> None:
        if self._failed is not None:
            return  # the channel is going down; the frame would go nowhere
        if self._urgent >= self._max_urgent:
            raise WriterOverflow(f"{self._urgent} control frames queued to an agent not reading")
        self._push(frame, True)

    async def send(self, frame: bytes) -> None:
        while self._bytes >= self._max_bytes and self._failed is None:
            self._room.clear()
            await self._room.wait()
        if self._failed is not None:
            raise ConnectionError("the agent channel is closed") from self._failed
        self._push(frame, False)

    def clear(self) -> None:
        """Drop what is queued (a new epoch: the old one's frames mean nothing now)."""
        self._queue.clear()
        self._bytes = self._urgent = 0
        self._room.set()

    def _push(self, frame: bytes, urgent: bool) -> None:
        if not self._queue and not self._writing and self._write_now is not None:
            # Nothing ahead of it: written here and now when the pipe takes it without a wait
            # (an interactive keystroke skips the writer task's turn). Never an await, so no
            # sender's cancellation can reach the pipe's own drain; order holds, as nothing
            # is queued or being written.
            # A pipe that fails here is left to the writer task, which says so.
            with contextlib.suppress(Exception):
                if self._write_now(frame):
                    return
        self._urgent += urgent
        self._queue.append((frame, urgent))
        self._bytes += len(frame)
        self._pending.set()

    async def run(self) -> None:
        """Write frames as they come, joining what is queued into one write (one syscall and
        one Docker frame per batch instead of per frame)."""
        try:
            while True:
                await self._pending.wait()
                batch: list[bytes] = []
                size = 0
                while self._queue and size < 256 * 1024:
                    frame, urgent = self._queue.popleft()
                    self._bytes -= len(frame)
                    self._urgent -= urgent
                    batch.append(frame)
                    size += len(frame)
                if not self._queue:
                    self._pending.clear()
                if self._bytes < self._max_bytes:
                    self._room.set()
                if batch:
                    self._writing = True
                    await self._transport.write(b"".join(batch))
                    self._writing = False
        except BaseException as exc:
            self._failed = exc
            self._room.set()
            raise
