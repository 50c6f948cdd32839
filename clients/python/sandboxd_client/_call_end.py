"""How a call ended, as the server said it: the server's status wins over a failed write.

When the server ends a client-streaming or bidi call (ImportArchive refused at a member's header,
WriteFileStream over the file cap, a failed BuildTemplate, an Interact command that exited)
while the client is still sending, the client's next write fails on the half-closed stream.
grpc.aio (1.85 and before) turns that failed write into the call's status, `INTERNAL: Internal
error from Core`, and when the event loop handles the failed write after the server's status has
arrived, that overwrites it: the caller saw INTERNAL instead of, say, FILE_TOO_LARGE in about a
third of refused imports (upstream grpc/grpc#36066). Node and Go report the server's status.

`CallEnd` keeps the first status a call ends with, read at the moment it is set (a call's done
callbacks run then, once), and answers it in place of that transport error; it also tells a
request generator to stop once the call has ended, so nothing more is read from the caller's
source or written to a call that takes no more.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Coroutine
from typing import Any, TypeVar

import grpc

T = TypeVar("T")
C = TypeVar("C")

# What grpc.aio puts in place of the server's status when a write fails (see above).
_WRITE_FAILURE_DETAILS = "Internal error from Core"


def _now(step: Coroutine[Any, Any, T]) -> T | None:
    """The value of a call accessor that completes at once (the status is set); None if it
    would wait, which it does not once the call is done."""
    try:
        step.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    step.close()
    return None


def is_write_failure(err: grpc.RpcError) -> bool:
    """The status grpc.aio gives a call whose write failed, not one a server sent."""
    code: grpc.StatusCode = err.code()
    details: str | None = err.details()
    return code == grpc.StatusCode.INTERNAL and details == _WRITE_FAILURE_DETAILS


class CallEnd:
    """The first status of the call it watches (one call at a time: `watch` starts over)."""

    def __init__(self) -> None:
        self.ended = False
        self._first_ok = False
        self._first: grpc.aio.AioRpcError | None = None

    def watch(self, call: C) -> C:
        """`call` itself, its end now observed."""
        self.ended, self._first_ok, self._first = False, False, None
        add = getattr(call, "add_done_callback", None)
        if add is not None:
            add(self._on_done)
        return call

    def _on_done(self, call: Any) -> None:
        self.ended = True
        code = _now(call.code())
        self._first_ok = code == grpc.StatusCode.OK
        if code is None or self._first_ok:
            return
        self._first = grpc.aio.AioRpcError(
            code,
            _now(call.initial_metadata()) or grpc.aio.Metadata(),
            _now(call.trailing_metadata()) or grpc.aio.Metadata(),
            _now(call.details()),
            _now(call.debug_error_string()),
        )

    def server_status(self, err: grpc.RpcError) -> grpc.RpcError:
        """The error to report for `err`: the server's own status where a failed write took
        its place, else `err`."""
        first = self._first
        if first is not None and is_write_failure(err) and not is_write_failure(first):
            return first
        return err

    def ended_ok(self, err: grpc.RpcError) -> bool:
        """Whether `err` is only the failed write that took the place of the server's OK: a
        stream that ended well (its responses all read) then, not an error."""
        return self._first_ok and is_write_failure(err)

    async def until_ended(self, requests: AsyncIterable[T]) -> AsyncIterator[T]:
        """`requests` until the call has ended (then nothing more is read from them)."""
        async for request in requests:
            if self.ended:
                return
            yield request


__all__ = ["CallEnd", "is_write_failure"]
