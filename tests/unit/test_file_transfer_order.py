"""Unit tests of the streamed write's order of events (sandboxd.file_transfer): stdin's EOF is
the writer's go-ahead to give the upload its name, so a call that fails midway never sends it,
and a call cancelled after it lets the writer finish before its stream is closed and the
upload removed.

The engine here is a scripted stand-in that records what the server does to each exec; the
real engine and helper run the same calls in tests/integration/test_file_transfer.py
(`test_write_stream_is_all_or_nothing`), where the race these orders close once left an upload
behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from sandboxd.commands.sandbox import AgentFirstCommands
from sandboxd.engine.protocol import ExecRequest, ExecStatus
from sandboxd.errors import InvalidArgument
from sandboxd.file_transfer import UPLOAD_PREFIX, FileTransfer
from sandboxd.helper_client import HelperClient

STAT = json.dumps(
    {"path": "keep.txt", "name": "keep.txt", "type": "file", "size": 3, "mode": 420, "mtime_ns": 1}
).encode()


class _Stream:
    """One exec: its events go to the engine's log; its output is released by the test."""

    def __init__(self, engine: _Engine, exec_id: str, args: list[str]) -> None:
        self.exec_id = exec_id
        self._engine = engine
        self.args = args
        self.released = asyncio.Event()
        if args[0] != "write":
            self.released.set()
        self._frames: list[tuple[int, bytes]] = [(1, STAT + b"\n")] if args[0] != "remove" else []
        self.ended = False

    def log(self, event: str) -> None:
        self._engine.events.append(f"{self.args[0]}:{event}")

    async def read(self) -> tuple[int, bytes] | None:
        await self.released.wait()
        return self._frames.pop(0) if self._frames else None

    async def write(self, data: bytes) -> None:
        self.log("data")

    def close_stdin(self) -> None:
        self.log("eof")

    async def wait_exit_code(self) -> int:
        await self.released.wait()
        self.log("exit")
        return 0

    async def close(self) -> None:
        self.ended = True
        self.log("close")


class _Engine:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.streams: list[_Stream] = []

    @contextlib.asynccontextmanager
    async def exec(self, container_id: str, request: ExecRequest) -> AsyncIterator[_Stream]:
        stream = _Stream(self, f"exec-{len(self.streams)}", list(request.argv[1:]))
        self.streams.append(stream)
        try:
            yield stream
        finally:
            await stream.close()

    async def exec_status(self, exec_id: str) -> ExecStatus:
        stream = next(s for s in self.streams if s.exec_id == exec_id)
        return ExecStatus(running=not stream.ended, exit_code=0 if stream.ended else None)


SESSION: Any = SimpleNamespace(
    session_id="s1",
    tenant="alpha",
    container_id="c1",
    spec=SimpleNamespace(user="1000:1000", limits=SimpleNamespace(workspace_bytes=1 << 20)),
)


def _transfer(engine: _Engine) -> FileTransfer:
    commands = AgentFirstCommands(engine, engine, None)  # type: ignore[arg-type]
    return FileTransfer(HelperClient(commands), upload_idle_s=1.0)


async def test_a_call_that_fails_midway_never_sends_eof_and_its_upload_is_removed() -> None:
    engine = _Engine()
    transfer = _transfer(engine)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"one"
        yield b"two"
        raise InvalidArgument("a second header")

    with pytest.raises(InvalidArgument):
        await transfer.write(SESSION, "keep.txt", 0o644, False, chunks())
    await transfer.close()
    writer, remover = engine.streams
    assert writer.args[0] == "write" and writer.args[1].startswith(UPLOAD_PREFIX)
    assert remover.args == ["remove", writer.args[1]]
    # No EOF: the writer is ended by the stream's close, never told its input is complete.
    assert engine.events[:4] == ["write:data", "write:data", "write:close", "remove:exit"]
    assert "write:eof" not in engine.events


async def test_a_call_cancelled_after_eof_lets_the_writer_finish_before_removing() -> None:
    engine = _Engine()
    transfer = _transfer(engine)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"abc"

    call = asyncio.create_task(transfer.write(SESSION, "keep.txt", 0o644, False, chunks()))
    while "write:eof" not in engine.events:
        await asyncio.sleep(0)
    call.cancel()
    for _ in range(20):
        await asyncio.sleep(0)
    # The writer (renaming now, in the real helper) is not cut off by closing its stream.
    assert "write:close" not in engine.events
    engine.streams[0].released.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    await transfer.close()
    writer, remover = engine.streams
    assert remover.args == ["remove", writer.args[1]]
    assert engine.events == [
        "write:data",
        "write:eof",
        "write:exit",
        "write:close",
        "remove:exit",
        "remove:close",
    ]


async def test_a_complete_call_names_the_upload_after_eof() -> None:
    engine = _Engine()
    transfer = _transfer(engine)
    engine_streams = engine.streams

    async def chunks() -> AsyncIterator[bytes]:
        yield b"abc"

    async def release() -> None:
        while not engine_streams:
            await asyncio.sleep(0)
        engine_streams[0].released.set()

    releaser = asyncio.create_task(release())
    info = await transfer.write(SESSION, "keep.txt", 0o644, False, chunks())
    await releaser
    assert info.path == "keep.txt"
    writer, mover = engine.streams
    assert mover.args == ["move", writer.args[1], "keep.txt", "--overwrite"]
    assert engine.events[:3] == ["write:data", "write:eof", "write:exit"]
