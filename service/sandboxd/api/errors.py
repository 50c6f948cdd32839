"""The one mapping from domain errors to gRPC status codes with google.rpc.ErrorInfo details.

Servicer methods are wrapped by `unary` or `stream`, which catch every `SandboxError` and
abort the call with its status. A write that found the server's own disk full is answered as
SERVER_DISK_FULL (sandboxd.disk_full). Anything else is a bug: it is logged with its traceback and
the caller gets a fixed "internal error" message, never the exception text.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeAlias, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from sandboxd import disk_full, errors
from sandboxd.api import error_details

log = logging.getLogger(__name__)

DOMAIN = "sandboxd"


class StreamIdle(errors.SandboxError):
    """A client stream that stopped moving (api.limits): no next message, or no reading.

    Raised with reason STREAM_IDLE (DEADLINE_EXCEEDED)."""


# Most specific class first: the first match wins.
STATUS_BY_ERROR: tuple[tuple[type[errors.SandboxError], grpc.StatusCode], ...] = (
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.OutOfRange, grpc.StatusCode.OUT_OF_RANGE),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.Internal, grpc.StatusCode.INTERNAL),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (StreamIdle, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
)


def status_code_for(exc: errors.SandboxError) -> grpc.StatusCode:
    for cls, code in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


# A status travels in trailers (grpc-message, and grpc-status-details-bin with the message
# again): clients refuse trailers over 8 KiB by default ("Stream removed"), so a message that
# quotes a caller's 4 KiB path, or metadata that does, is cut to fit.
MAX_MESSAGE_BYTES = 1024  # UTF-8; percent-encoded in grpc-message, at most 3 KiB there
MAX_METADATA_VALUE_BYTES = 256


def _bounded(text: str, limit: int) -> str:
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) <= limit:
        return text
    return raw[: limit - 3].decode("utf-8", "ignore") + "\u2026"  # the ellipsis is 3 bytes


def to_status(exc: errors.SandboxError) -> grpc.Status:
    if isinstance(exc, errors.Internal) and exc is not _INTERNAL:
        # An engine answer we did not expect: its text is for the operator's log (it may name
        # host paths and cgroups), the caller gets the fixed message.
        log.error("internal error: %s", exc.message)
        exc = _INTERNAL
    code = status_code_for(exc)
    metadata = {
        k: _bounded(v, MAX_METADATA_VALUE_BYTES)
        for k, v in error_details.metadata(exc.metadata).items()
    }
    info = error_details_pb2.ErrorInfo(reason=exc.reason, domain=DOMAIN, metadata=metadata)
    details = [any_pb2.Any()]
    details[0].Pack(info)
    retry = error_details.retry_info(exc.reason, exc.metadata)
    if retry is not None:
        details.append(any_pb2.Any())
        details[-1].Pack(retry)
    message = _bounded(exc.message, MAX_MESSAGE_BYTES)
    proto = status_pb2.Status(code=code.value[0], message=message, details=details)
    return rpc_status.to_status(proto)


async def abort(context: grpc.aio.ServicerContext[Any, Any], exc: errors.SandboxError) -> NoReturn:
    await context.abort_with_status(to_status(exc))
    raise AssertionError("abort_with_status returned")  # pragma: no cover


_INTERNAL = errors.Internal("internal error; the server log has the details")

S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx: TypeAlias = grpc.aio.ServicerContext[Any, Any]


def _drop_tracebacks(exc: BaseException) -> None:
    """A domain error is an answer, never logged with its traceback: drop the tracebacks of
    it and of what it was raised from. They hold every frame the error passed through, and
    with them the call's state (an import's checker, buffers), in reference cycles (a frame
    holds the future that holds the error) that only the cyclic collector would break, at a
    time of its own choosing: refused imports had kept tens of MiB each alive that way."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        each = todo.pop()
        if each is None or id(each) in seen:
            continue
        seen.add(id(each))
        each.__traceback__ = None
        todo += [each.__cause__, each.__context__]


@contextlib.asynccontextmanager
async def _answered(context: Ctx, where: str) -> AsyncIterator[None]:
    """Every failure inside becomes the call's status: a domain error its own, anything else
    (a bug) the fixed internal one, logged with its traceback."""
    try:
        yield
    except errors.SandboxError as exc:
        _drop_tracebacks(exc)
        await abort(context, exc)
    except grpc.aio.AbortError:
        raise
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # this call was cancelled (its client, its deadline, the server stopping)
        # Something else's cancellation leaked into the call (a future another task ended):
        # re-raised, the call would get no answer until its deadline. A bug, answered.
        log.error("a cancellation that was not this call's reached %s", where, exc_info=True)
        await abort(context, _INTERNAL)
    except Exception as exc:
        full = disk_full.error_for(exc)  # not a bug: the data directory's disk is full
        if full is not None:
            _drop_tracebacks(exc)
            await abort(context, full)
        log.exception("unexpected error in %s", where)
        await abort(context, _INTERNAL)


def unary(
    fn: Callable[[S, Req, Ctx], Awaitable[Resp]],
) -> Callable[[S, Req, Ctx], Awaitable[Resp]]:
    @functools.wraps(fn)
    async def wrapper(self: S, request: Req, context: Ctx) -> Resp:
        async with _answered(context, fn.__qualname__):
            return await fn(self, request, context)
        raise AssertionError("unreachable: the call was answered")  # pragma: no cover

    return wrapper


def stream(
    fn: Callable[[S, Req, Ctx], AsyncGenerator[Resp, None]],
) -> Callable[[S, Req, Ctx], AsyncIterator[Resp]]:
    @functools.wraps(fn)
    async def wrapper(self: S, request: Req, context: Ctx) -> AsyncIterator[Resp]:
        async with _answered(context, fn.__qualname__):
            # aclosing: a cancelled call closes the inner generator now, so its cleanup
            # (killing the command) runs at once rather than whenever GC gets to it.
            async with contextlib.aclosing(fn(self, request, context)) as items:
                async for item in items:
                    yield item

    return wrapper
