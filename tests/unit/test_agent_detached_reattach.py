"""DetachedStream across the agent's RESET `GAP` (commands/detached.py): it attaches again for as
long as the agent's ring keeps overrunning it while bytes come between, and gives up only on an
agent that answers attach after attach with GAP and nothing else."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import pytest
from sandboxd.commands import detached
from sandboxd.commands.detached import GAP_FD, DetachedStream
from sandboxd.errors import Internal


class _Overrun:
    """One attach stream: `chunks` of output, then the agent's RESET GAP."""

    exec_id = "x"

    def __init__(self, at: int, chunks: int) -> None:
        self.opened: dict[str, Any] = {"start": {"1": at + 10, "2": 0}, "end": {"1": at + 10}}
        self._left = [(1, b"y" * 5)] * chunks
        self.reset_name = ""

    async def read(self) -> tuple[int, bytes] | None:
        if self._left:
            return self._left.pop(0)
        self.reset_name = "GAP"
        raise Internal("the agent reset the stream: GAP")


class _Router:
    """An agent whose ring is always 10 bytes ahead of the reader."""

    def __init__(self, chunks: int) -> None:
        self.attaches = 0
        self._chunks = chunks

    @contextlib.asynccontextmanager
    async def open_kind(
        self, sandbox_id: str, kind: str, request: dict[str, Any]
    ) -> AsyncIterator[_Overrun]:
        self.attaches += 1
        yield _Overrun(request["offsets"]["1"], self._chunks)


async def _stream(router: _Router) -> tuple[DetachedStream, AsyncExitStack]:
    stack = AsyncExitStack()
    stream = DetachedStream(router, "c", "d", stack)  # type: ignore[arg-type]
    await stream.attach()
    return stream, stack


async def test_a_reader_overrun_again_and_again_goes_on_while_bytes_come() -> None:
    router = _Router(chunks=1)
    stream, stack = await _stream(router)
    async with stack:
        items = [await stream.read() for _ in range(3 * detached.MAX_REATTACH)]
    gaps = [i for i in items if i is not None and i[0] == 1 + GAP_FD]
    assert len(gaps) == 1.5 * detached.MAX_REATTACH  # a gap, then a chunk, each attach
    assert all(int.from_bytes(g[1], "big") == 10 for g in gaps)


async def test_an_agent_that_only_ever_answers_gap_is_given_up() -> None:
    router = _Router(chunks=0)
    stream, stack = await _stream(router)
    async with stack:
        with pytest.raises(Internal):
            while True:
                await stream.read()
    assert router.attaches == detached.MAX_REATTACH + 1
