"""The reply writes' idle timeout (api.limits.StreamGuard): a client that stops reading ends
the call with STREAM_IDLE; writes that keep moving, however long the stream, never do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from sandboxd.api.limits import StreamGuard


class _Handler:
    """A server-streaming grpc.RpcMethodHandler: its other three behaviours are None."""

    def __init__(self, behavior: Any) -> None:
        self.unary_unary = None
        self.stream_unary = None
        self.unary_stream = behavior
        self.stream_stream = None

    def _replace(self, **kw: Any) -> Any:
        return kw["unary_stream"]


class _Context:
    def __init__(self, delays: list[float]) -> None:
        self.delays = delays
        self.written: list[int] = []
        self.aborted: grpc.Status | None = None

    async def write(self, item: int) -> None:
        await asyncio.sleep(self.delays[item])
        self.written.append(item)

    async def abort_with_status(self, status: grpc.Status) -> None:
        self.aborted = status


def _writer(idle: float, closed: list[bool]) -> Any:
    async def behavior(request: Any, context: Any) -> AsyncIterator[int]:
        try:
            for i in range(len(context.delays)):
                await asyncio.sleep(0.02)  # the servicer's own waits are never timed
                yield i
        finally:
            closed.append(True)

    return StreamGuard(idle).wrap(_Handler(behavior), None)


async def test_a_stalled_write_ends_the_stream_as_idle() -> None:
    closed: list[bool] = []
    context = _Context([0, 0, 30.0, 0])
    await asyncio.wait_for(_writer(0.1, closed)(None, context), 5)
    assert context.written == [0, 1]
    assert closed == [True]
    assert context.aborted is not None
    assert context.aborted.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "took no reply data" in context.aborted.details


async def test_writes_that_move_are_never_cut_however_long_the_stream() -> None:
    closed: list[bool] = []
    # Each write well under the idle timeout (a loaded host's late wake-ups fit in the margin);
    # the stream, over twice it.
    context = _Context([0.05] * 15)
    await asyncio.wait_for(_writer(0.3, closed)(None, context), 10)
    assert context.written == list(range(15))
    assert context.aborted is None


async def test_a_cancelled_call_is_still_cancelled() -> None:
    closed: list[bool] = []
    context = _Context([30.0])
    task = asyncio.create_task(_writer(0.1, closed)(None, context))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert context.aborted is None and closed == [True]
