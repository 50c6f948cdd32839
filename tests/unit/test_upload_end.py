"""An upload's end, over a real gRPC port: what a servicer does when the request stream ends
(merge an import, rename a file into place) happens only for a client that closed the stream,
never for one that cancelled the call.

grpc.aio reads a cancelled call's request stream as ended, and the CancelledError that stops
the handler comes a few loop turns later: a handler that commits at the end could commit for a
client that went away (an ImportArchive cancelled after a complete archive once landed whole).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from sandboxd.api.limits import StreamGuard

METHOD = "/test.Uploads/Upload"
REFUSED = "/test.Uploads/Refused"
ROUNDS = 60


class Recorder:
    def __init__(self) -> None:
        self.read_one = asyncio.Event()
        self.finished = asyncio.Event()
        self.committed = 0

    async def upload(self, requests: AsyncIterator[bytes], context: Any) -> bytes:
        try:
            async for _ in requests:
                self.read_one.set()
            self.committed += 1  # the commit point: the stream ended
            return b"done"
        finally:
            self.finished.set()


class Refuser:
    """A handler that reads its stream on a task of its own and refuses the upload while that
    task may be confirming the stream's end, as an import does when a member is refused."""

    def __init__(self) -> None:
        self.turns = 0

    async def upload(self, requests: AsyncIterator[bytes], context: Any) -> bytes:
        got_one = asyncio.Event()

        async def feed() -> None:
            async for _ in requests:
                got_one.set()

        feeder = asyncio.create_task(feed())
        await got_one.wait()
        for _ in range(self.turns):  # each round refuses a loop turn later
            await asyncio.sleep(0)
        feeder.cancel()
        try:
            await feeder
        except asyncio.CancelledError:
            pass
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused")
        raise AssertionError("abort raises")


class Handlers(grpc.GenericRpcHandler):
    """Each method's upload handler, behind the StreamGuard the server puts in front of it."""

    def __init__(self, uploads: dict[str, Callable[..., Awaitable[bytes]]]) -> None:
        self._uploads = uploads

    def service(self, details: Any) -> Any:
        upload = self._uploads.get(details.method)
        if upload is None:
            return None
        plain = grpc.stream_unary_rpc_method_handler(upload)
        return StreamGuard(30).wrap(plain, details)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Recorder, Refuser, grpc.aio.Channel]]:
    recorder, refuser = Recorder(), Refuser()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((Handlers({METHOD: recorder.upload, REFUSED: refuser.upload}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield recorder, refuser, channel
    finally:
        await channel.close()
        await server.stop(None)


async def _all_of_it() -> AsyncIterator[bytes]:
    yield b"all of it"


async def _then_quiet() -> AsyncIterator[bytes]:
    yield b"all of it"
    await asyncio.Event().wait()  # the client goes quiet, then cancels


async def test_a_cancelled_upload_never_reaches_its_end(
    served: tuple[Recorder, Refuser, grpc.aio.Channel],
) -> None:
    recorder, _, channel = served
    upload = channel.stream_unary(METHOD)
    for _ in range(ROUNDS):
        recorder.read_one.clear()
        recorder.finished.clear()
        call = upload(_then_quiet())
        await asyncio.wait_for(recorder.read_one.wait(), 10)
        call.cancel()
        await asyncio.wait_for(recorder.finished.wait(), 10)
        with pytest.raises(asyncio.CancelledError):
            await call
    assert recorder.committed == 0


async def test_a_closed_upload_reaches_its_end_and_its_answer(
    served: tuple[Recorder, Refuser, grpc.aio.Channel],
) -> None:
    recorder, _, channel = served
    upload = channel.stream_unary(METHOD)

    for _ in range(5):
        assert await upload(_all_of_it()) == b"done"
    assert recorder.committed == 5


async def test_an_upload_refused_as_its_end_is_confirmed_is_answered(
    served: tuple[Recorder, Refuser, grpc.aio.Channel],
) -> None:
    """The confirmation of the end is a batch on the call; a refusal answered while it is in
    flight would send the initial metadata twice, and the client would wait forever."""
    _, refuser, channel = served
    upload = channel.stream_unary(REFUSED)

    for turns in range(ROUNDS):
        refuser.turns = turns % 12
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await upload(_all_of_it(), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, turns
