"""Every servicer call gets an answer: the one wrapper (api/errors.py) maps what escapes."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from sandboxd.api import errors


class _Context:
    def __init__(self) -> None:
        self.status: grpc.Status | None = None

    async def abort_with_status(self, status: grpc.Status) -> None:
        self.status = status
        raise grpc.aio.AbortError()


class _Servicer:
    def __init__(self, leak: asyncio.Future[None]) -> None:
        self.leak = leak

    @errors.unary
    async def Call(self, request: Any, context: Any) -> str:  # noqa: N802 - gRPC's style
        await asyncio.shield(self.leak)  # a future another task cancels
        return "never"


async def test_a_cancellation_that_is_not_the_calls_own_is_answered() -> None:
    """A future another task cancelled must not leave the call without an answer (it would
    wait for its deadline): the caller gets the fixed INTERNAL answer."""
    leak: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    context = _Context()
    call = asyncio.create_task(_Servicer(leak).Call(None, context))
    await asyncio.sleep(0)
    leak.cancel()
    with pytest.raises(grpc.aio.AbortError):
        await call
    assert context.status is not None and context.status.code == grpc.StatusCode.INTERNAL


async def test_the_calls_own_cancellation_goes_through() -> None:
    leak: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    context = _Context()
    call = asyncio.create_task(_Servicer(leak).Call(None, context))
    await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert context.status is None


def test_a_status_quoting_a_long_name_fits_a_clients_trailer_limit() -> None:
    """Found in CI: a refused archive member's 4 KiB name, quoted in the message and again in
    the details, made trailers over a client's 8 KiB limit: the client saw 'Stream removed'
    instead of the refusal. Every status now fits, whatever it quotes."""
    import base64
    import urllib.parse

    from sandboxd.errors import InvalidArgument

    name = "\u00e9/" * 3000  # long, and non-ASCII: percent-encoding triples each byte
    exc = InvalidArgument(f"archive member {name!r}: too deep", metadata={"member": name})
    status = errors.to_status(exc)
    trailers = dict(status.trailing_metadata)
    details = trailers["grpc-status-details-bin"]
    encoded = urllib.parse.quote(status.details, safe=" ")
    size = len(encoded) + len(base64.b64encode(details)) + 200  # other trailers, generously
    assert size < 8 * 1024, size
    assert status.details.startswith("archive member") and status.details.endswith("\u2026")
