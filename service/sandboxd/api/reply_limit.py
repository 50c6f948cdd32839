"""The interceptor that holds every reply message to the caller's limit (api/replies.py).

For each call it takes the limit from the request's `max_reply_bytes` (where the request has
one; a negative value is INVALID_ARGUMENT before the servicer runs) or 4 MiB, bounded by the
server's own message limit, and keeps it for the servicer (`replies.current`). Each reply
message the servicer returns or yields is then measured as serialized: one still over the
limit ends the call with RESOURCE_EXHAUSTED REPLY_TOO_LARGE, a status the caller can read,
rather than a message its client would refuse (losing everything the reply said). The RPCs whose
replies grow make them fit before this (replies.py); here is the net under every RPC, a new
one included, so no reply can pass a default client's limit.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from google.protobuf.message import Message

from sandboxd import errors
from sandboxd.api import replies
from sandboxd.api.chain import Layer, rewrap
from sandboxd.api.errors import to_status


class ReplyLimit(Layer):
    def __init__(self, server_max_bytes: int) -> None:
        self._max = server_max_bytes

    def wrap(self, handler: Any, handler_call_details: Any) -> Any:
        if handler is None:
            return None
        method = str(handler_call_details.method)

        def limited(kind: str, behavior: Callable[..., Any]) -> Callable[..., Any] | None:
            streamed_in = kind.startswith("stream_")
            if not kind.endswith("_stream"):
                return self._once(behavior, method, streamed_in)
            if not inspect.isasyncgenfunction(behavior):
                return None  # a writer (reflection): nothing to measure here
            return self._each(behavior, method, streamed_in)

        return rewrap(handler, limited)

    async def _limit_or_abort(self, request: Any, streamed_in: bool, context: Any) -> int:
        """The call's limit, kept for the servicer; a refused one ends the call before the
        servicer runs. One place for both kinds of call, so they refuse the same requests."""
        asked = 0
        try:
            if not streamed_in and isinstance(request, Message):
                if replies.FIELD in request.DESCRIPTOR.fields_by_name:
                    asked = int(getattr(request, replies.FIELD))
            limit = replies.limit_for(asked, self._max)
        except errors.SandboxError as exc:
            await context.abort_with_status(to_status(exc))
            raise AssertionError("abort_with_status returned") from None
        replies.set_current(limit)
        return limit

    def _once(
        self, behavior: Callable[..., Awaitable[Any]], method: str, streamed_in: bool
    ) -> Callable[..., Awaitable[Any]]:
        async def bounded(request: Any, context: Any) -> Any:
            limit = await self._limit_or_abort(request, streamed_in, context)
            result = behavior(request, context)
            response = await result if inspect.isawaitable(result) else result
            await _check(response, limit, method, context)
            return response

        return bounded

    def _each(
        self, behavior: Callable[..., AsyncGenerator[Any, None]], method: str, streamed_in: bool
    ) -> Callable[..., AsyncIterator[Any]]:
        async def bounded(request: Any, context: Any) -> AsyncIterator[Any]:
            limit = await self._limit_or_abort(request, streamed_in, context)
            async with contextlib.aclosing(behavior(request, context)) as items:
                async for item in items:
                    await _check(item, limit, method, context)
                    yield item

        return bounded


async def _check(message: Any, limit: int, method: str, context: Any) -> None:
    if not isinstance(message, Message):
        return
    size = message.ByteSize()
    if size > limit:
        name = method.rsplit("/", 1)[-1]
        exc = replies.too_large(
            f"this {name} reply", size, limit, "the server could not make it smaller"
        )
        await context.abort_with_status(to_status(exc))
