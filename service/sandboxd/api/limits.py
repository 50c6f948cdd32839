"""Limits every streaming RPC passes through, whatever its servicer: idle timeouts and caps.

Each open stream holds server resources (an engine connection, a spool, a command), so one
tenant must not be able to keep them forever or take them all:

- `StreamGuard` (the outermost interceptor) gives every client upload (ImportArchive and any
  other client-streaming RPC that answers once) an idle timeout: no next message within
  `stream_idle_timeout_s` ends the call with DEADLINE_EXCEEDED, reason STREAM_IDLE. It also
  writes every streamed reply itself with the same timeout, so a client that stops reading
  (an ExportArchive behind a stalled reader) ends the call with the same error instead of
  holding it; the servicer's generator is closed and its cleanup runs at once. Interact's
  input may stay quiet (a person at a terminal): its own idle timeout bounds it
  (InteractStart.idle_timeout, no input and no output; sandboxd.interactive).
  An upload's end is confirmed before the servicer sees it (`ended_by_the_client`): gRPC ends
  a request stream the same way whether the client closed it or cancelled the call, and what
  a servicer commits at the end (an import merged, a file renamed into place) must not land
  for a client that went away.
- `StreamCaps` (after authentication, so the tenant is known) counts each tenant's open
  streaming calls and refuses one over `tenant_max_streams` with RESOURCE_EXHAUSTED, reason
  TENANT_STREAM_QUOTA, before the servicer runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from sandboxd import errors, tenancy
from sandboxd.api.chain import Layer, rewrap
from sandboxd.api.errors import StreamIdle, to_status
from sandboxd.futures import retrieve
from sandboxd.reasons import Reason
from sandboxd.wait_clock import WaitClock


class StreamGuard(Layer):
    def __init__(self, idle_timeout_s: float) -> None:
        self._idle = idle_timeout_s

    def wrap(self, handler: Any, handler_call_details: Any) -> Any:
        if handler is None:
            return None
        return rewrap(handler, self._guarded)

    def _guarded(self, kind: str, behavior: Callable[..., Any]) -> Callable[..., Any] | None:
        """Uploads get the idle timeout, replies the write timeout; a unary call is left."""
        if kind == "stream_unary":
            return self._idle_uploads(behavior)
        return self._timed_writes(behavior) if kind.endswith("_stream") else None

    def _idle_uploads(self, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        idle = self._idle

        async def guarded(requests: Any, context: Any) -> Any:
            ended = ended_by_the_client(context)
            return await behavior(idle_limited(requests, idle, ended), context)

        return guarded

    def _timed_writes(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        if not inspect.isasyncgenfunction(behavior):
            return behavior  # already a writer: nothing generic to time
        idle = self._idle

        async def writer(request: Any, context: Any) -> None:
            stalled = False
            clock = WaitClock(idle)  # one timer per `idle`, not one per message
            try:
                async with contextlib.aclosing(behavior(request, context)) as items:
                    async for item in items:
                        clock.begin()
                        try:
                            await context.write(item)
                        except asyncio.CancelledError:
                            if clock.expired():
                                stalled = True
                                break
                            raise
                        finally:
                            clock.end()
            finally:
                clock.stop()
            if stalled:
                # The servicer's stream is closed by now (its command, engine connection and
                # stream slot freed); the status itself reaches the client only if it reads
                # again, so that wait holds nothing but the call.
                await context.abort_with_status(
                    to_status(
                        StreamIdle(
                            f"the client took no reply data for {idle:g} s "
                            "(stream_idle_timeout_s); the stream was ended",
                            reason=Reason.STREAM_IDLE,
                            metadata={"timeout_s": f"{idle:g}", "side": "reply"},
                        )
                    )
                )

        return writer


def ended_by_the_client(context: Any) -> Callable[[], Awaitable[None]]:
    """A check, for the end of `context`'s request stream, that the client closed it.

    grpc.aio reads a cancelled call's stream as ended: the read that the cancellation
    completes returns no message, and the CancelledError that ends the handler comes a few
    loop turns later. Core knows which it was: a batch started on a cancelled call fails. The
    (empty) initial metadata is such a batch, harmless on a live call; its failure raises
    CancelledError here, where the stream would have ended. Initial metadata the servicer
    already sent leaves nothing to check with: the stream then ends as gRPC said.

    The batch is let finish even when the reading task is cancelled (a servicer refusing
    the upload stops its reader): an answer sent while it is in flight would carry the
    initial metadata a second time, core would refuse that batch, and the client would wait
    for a status that never comes."""

    async def check() -> None:
        batch = asyncio.ensure_future(context.send_initial_metadata(()))
        batch.add_done_callback(retrieve)  # its reader may be gone
        try:
            await asyncio.shield(batch)
        except asyncio.CancelledError:
            await asyncio.wait([batch])
            raise
        except grpc.aio.UsageError:
            return  # sent already (or the call is finished): nothing left to ask with
        except grpc.aio.InternalError:
            raise asyncio.CancelledError("the client cancelled the call") from None

    return check


async def idle_limited(
    requests: AsyncIterator[Any],
    idle: float,
    ended: Callable[[], Awaitable[None]] | None = None,
) -> AsyncIterator[Any]:
    """The client's messages, each awaited at most `idle` seconds (StreamIdle otherwise);
    `ended`, when given, is awaited at the stream's end and may raise instead."""
    iterator = aiter(requests)
    while True:
        try:
            async with asyncio.timeout(idle):
                item = await anext(iterator)
        except StopAsyncIteration:
            if ended is not None:
                await ended()
            return
        except TimeoutError:
            raise StreamIdle(
                f"no message from the client for {idle:g} s (stream_idle_timeout_s); "
                "the upload was abandoned",
                reason=Reason.STREAM_IDLE,
                metadata={"timeout_s": f"{idle:g}", "side": "request"},
            ) from None
        yield item


class StreamCaps(Layer):
    def __init__(self, max_streams: int) -> None:
        self.slots = tenancy.StreamSlots(max_streams)

    def wrap(self, handler: Any, handler_call_details: Any) -> Any:
        if handler is None or not self.slots.limit:
            return handler
        if not (handler.request_streaming or handler.response_streaming):
            return handler
        return rewrap(handler, lambda _, behavior: self._counted(behavior))

    def _counted(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        # A refusal comes from entering the slot: the servicer's own errors are aborts by then.
        slots = self.slots
        if inspect.isasyncgenfunction(behavior):

            async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
                try:
                    async with slots.slot():
                        async with contextlib.aclosing(behavior(request, context)) as items:
                            async for item in items:
                                yield item
                except errors.ResourceExhausted as exc:
                    await context.abort_with_status(to_status(exc))

            return streaming

        async def unary(request: Any, context: Any) -> Any:
            try:
                async with slots.slot():
                    result = behavior(request, context)
                    return await result if inspect.isawaitable(result) else result
            except errors.ResourceExhausted as exc:
                await context.abort_with_status(to_status(exc))

        return unary
