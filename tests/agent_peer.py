"""A scripted agent over an in-memory pipe, for the server channel's unit tests.

It speaks through tests/agent_wire.py's codec (written from docs/agent.md independently of
service/sandboxd/agent/), so the two implementations check each other. The test drives it step
by step: wait for what the server sent, answer what the script says.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import agent_wire as w
from agent_wire import Frame


class MemoryTransport:
    """The server's end: `read` gets what the agent wrote; `write` waits while the agent's
    stdin (a bounded queue) is full, as a pipe would."""

    def __init__(self, stdin_chunks: int = 64) -> None:
        self.to_server: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.to_agent: asyncio.Queue[bytes] = asyncio.Queue(maxsize=stdin_chunks)
        self.closed = False

    async def read(self) -> bytes | None:
        return await self.to_server.get()

    async def write(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionError("closed")
        await self.to_agent.put(data)

    async def close(self) -> None:
        self.closed = True


class ScriptedAgent:
    def __init__(self, stdin_chunks: int = 64) -> None:
        self.transport = MemoryTransport(stdin_chunks)
        self._decoder = w.Decoder()
        self._frames: list[Frame] = []
        self.syncs = 0
        self.nonce = ""

    # ----- what the server sent -----------------------------------------------------------

    async def recv(self, timeout: float = 2.0) -> Frame:
        while not self._frames:
            chunk = await asyncio.wait_for(self.transport.to_agent.get(), timeout)
            self.syncs += chunk.count(w.SYNC)
            self._frames += self._decoder.feed(chunk.replace(w.SYNC, b""))
        return self._frames.pop(0)

    async def recv_type(self, ftype: int, timeout: float = 2.0) -> Frame:
        """The next frame of `ftype`, skipping others (PINGs, WINDOWs...)."""
        while True:
            frame = await self.recv(timeout)
            if frame.type == ftype:
                return frame

    def pending(self) -> list[Frame]:
        """Frames already written by the server, without waiting."""
        while not self.transport.to_agent.empty():
            chunk = self.transport.to_agent.get_nowait()
            self.syncs += chunk.count(w.SYNC)
            self._frames += self._decoder.feed(chunk.replace(w.SYNC, b""))
        out, self._frames = self._frames, []
        return out

    # ----- what it says --------------------------------------------------------------------

    def send(self, raw: bytes) -> None:
        self.transport.to_server.put_nowait(raw)

    def send_json(self, ftype: int, stream: int, doc: dict[str, Any]) -> None:
        self.send(w.encode_json(ftype, stream, doc))

    def hang_up(self) -> None:
        self.transport.to_server.put_nowait(None)

    async def handshake(self, **extra: Any) -> dict[str, Any]:
        """Answer the next HELLO; its document."""
        hello = (await self.recv_type(w.HELLO)).json()
        self.nonce = hello["nonce"]
        self.send_json(
            w.HELLO_OK,
            0,
            {
                "version": 1,
                "nonce": self.nonce,
                "instance": "peer",
                "pid": 1,
                "processes": [],
                **extra,
            },
        )
        return dict(hello)

    async def accept_open(self, pid: int = 42) -> tuple[int, dict[str, Any]]:
        """Answer the next OPEN with OPEN_OK; its stream id and request."""
        frame = await self.recv_type(w.OPEN)
        self.send_json(w.OPEN_OK, frame.stream, {"pid": pid})
        return frame.stream, json.loads(frame.payload)

    def output(self, stream: int, data: bytes, fd: int = 1) -> None:
        self.send(w.data(stream, data, fd))

    def exit(self, stream: int, code: int = 0) -> None:
        self.send_json(w.EXIT, stream, {"exit_code": code, "signal": None})
