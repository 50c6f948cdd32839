"""The gRPC port before authentication: a call without a valid token is refused before the
server reads its request, so an unauthenticated caller holds no stream waiting for (or
buffering) a message; the transport's own limits are set, not left to defaults."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator

import grpc
import pytest
from sandboxd import tenancy
from sandboxd.api.auth import AuthInterceptor
from sandboxd.server.transport import transport_options

TOKEN = "alpha-token"


def _table() -> tenancy.TokenTable:
    return tenancy.TokenTable((("alpha", hashlib.sha256(TOKEN.encode()).digest()),))


async def _echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return b"echo:" + request


async def _count(
    request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
) -> AsyncIterator[bytes]:
    for i in range(3):
        yield str(i).encode()


async def _serve(
    handshake_timeout_ms: int = 10_000, max_connections: int = 0
) -> tuple[grpc.aio.Server, int]:
    options = transport_options(4 << 20, handshake_timeout_ms, max_connections)
    server = grpc.aio.server(interceptors=[AuthInterceptor(_table())], options=options)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "t.S",
                {
                    "Unary": grpc.unary_unary_rpc_method_handler(_echo),
                    "Stream": grpc.unary_stream_rpc_method_handler(_count),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def test_an_unauthenticated_call_is_refused_before_its_message() -> None:
    """Headers, then a message that never comes: refused at once, not left waiting for it."""
    server, port = await _serve()
    never = asyncio.Event()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:

            async def requests() -> AsyncIterator[bytes]:
                await never.wait()
                yield b""

            call = channel.stream_unary("/t.S/Unary")(requests(), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        never.set()
        await server.stop(None)


async def test_refusals_and_answers_of_every_kind() -> None:
    server, port = await _serve()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            unary = channel.unary_unary("/t.S/Unary")
            stream = channel.unary_stream("/t.S/Stream")
            for metadata in [(), (("authorization", "Bearer wrong"),)]:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await unary(b"x" * 100_000, metadata=metadata, timeout=10)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in stream(b"x", metadata=metadata, timeout=10):
                        pass
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            good = (("authorization", f"Bearer {TOKEN}"),)
            assert await unary(b"hi", metadata=good, timeout=10) == b"echo:hi"
            assert [m async for m in stream(b"", metadata=good, timeout=10)] == [b"0", b"1", b"2"]
    finally:
        await server.stop(None)


def test_the_transport_limits_are_set() -> None:
    options = dict(transport_options(max_message_bytes=4 << 20))
    assert options["grpc.max_concurrent_streams"] > 0
    assert options["grpc.max_metadata_size"] <= 64 * 1024
    assert options["grpc.http2.max_ping_strikes"] > 0
    assert options["grpc.keepalive_permit_without_calls"] == 0
    assert options["grpc.max_connection_idle_ms"] > 0
    capped = dict(transport_options(4 << 20, max_connections=1024))
    assert capped["grpc.max_allowed_incoming_connections"] == 1024


async def test_connections_past_the_cap_are_closed_at_once_and_freed_places_serve() -> None:
    """Eight idle TCP connections to a port capped at four: the four past the cap are closed
    at once (the process's descriptors stay for its other work), the first four are held; once
    they are gone a client's call is served. Without the cap all eight were held."""
    server, port = await _serve(handshake_timeout_ms=60_000, max_connections=4)
    conns = []
    try:
        for _ in range(8):
            conns.append(await asyncio.open_connection("127.0.0.1", port))
            await asyncio.sleep(0.02)
        ended = []
        for reader, _ in conns:
            with contextlib.suppress(TimeoutError):
                while await asyncio.wait_for(reader.read(4096), 0.5):
                    pass
            ended.append(reader.at_eof())
        assert ended.count(True) == 4 and not any(ended[:4]), ended
        for _, writer in conns:
            writer.close()
        await asyncio.sleep(0.3)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/t.S/Unary")
            got = await call(b"x", metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10)
            assert got == b"echo:x"
    finally:
        await server.stop(None)


async def test_a_connection_that_never_finishes_its_handshake_is_closed() -> None:
    server, port = await _serve(handshake_timeout_ms=500)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"PRI * HTTP/2.0\r\n")  # the preface begun, never ended
        await writer.drain()
        await asyncio.wait_for(reader.read(), 10)  # at most a GOAWAY, then the end
        assert reader.at_eof()
        writer.close()
    finally:
        await server.stop(None)


async def test_metadata_past_the_limit_ends_the_call_and_others_are_served() -> None:
    """Headers past `grpc.max_metadata_size` (16 KiB), with or without a token: the call
    ends before the server reads it, and a call of ordinary size on the same port answers."""
    server, port = await _serve()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            unary = channel.unary_unary("/t.S/Unary")
            good = (("authorization", f"Bearer {TOKEN}"),)
            for extra in [(), good]:
                big = (*extra, *((f"x-pad-{i}", "p" * 1000) for i in range(40)))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await unary(b"hi", metadata=big, timeout=10)
                assert err.value.code() != grpc.StatusCode.OK
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            unary = channel.unary_unary("/t.S/Unary")
            small = (*good, *((f"x-pad-{i}", "p" * 1000) for i in range(4)))
            assert await unary(b"hi", metadata=small, timeout=10) == b"echo:hi"
    finally:
        await server.stop(None)


async def test_one_connection_holds_at_most_the_stream_limit_and_others_are_served() -> None:
    """600 calls held open on one connection: the server runs at most
    `grpc.max_concurrent_streams` of them at once (the rest wait in the client or are
    refused as not started), and a call on another connection is answered meanwhile."""
    from sandboxd.server.transport import MAX_CONCURRENT_STREAMS

    release = asyncio.Event()
    active = [0, 0]  # now, most

    async def hold(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        active[0] += 1
        active[1] = max(active[1], active[0])
        try:
            await release.wait()
        finally:
            active[0] -= 1
        return b"done"

    options = transport_options(4 << 20)
    server = grpc.aio.server(interceptors=[AuthInterceptor(_table())], options=options)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "t.S",
                {
                    "Hold": grpc.unary_unary_rpc_method_handler(hold),
                    "Unary": grpc.unary_unary_rpc_method_handler(_echo),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    good = (("authorization", f"Bearer {TOKEN}"),)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            calls = [
                asyncio.ensure_future(channel.unary_unary("/t.S/Hold")(b"", metadata=good))
                for _ in range(MAX_CONCURRENT_STREAMS + 88)
            ]
            for _ in range(500):
                if active[0] >= MAX_CONCURRENT_STREAMS:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            # A second connection (its own channel options make it one) is served.
            other_options = [("grpc.use_local_subchannel_pool", 1)]
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{port}", options=other_options
            ) as other:
                got = await other.unary_unary("/t.S/Unary")(b"hi", metadata=good, timeout=10)
            assert got == b"echo:hi"
            assert active[1] <= MAX_CONCURRENT_STREAMS, active
            assert active[0] == MAX_CONCURRENT_STREAMS, active
            release.set()
            ended = await asyncio.gather(*calls, return_exceptions=True)
            refused = [e for e in ended if isinstance(e, grpc.aio.AioRpcError)]
            # Past the limit a stream waits in the client or is refused (REFUSED_STREAM,
            # UNAVAILABLE: safe to retry, the server never started it); never run.
            assert all(e.code() == grpc.StatusCode.UNAVAILABLE for e in refused), refused[:1]
            assert ended.count(b"done") == len(calls) - len(refused) >= MAX_CONCURRENT_STREAMS
    finally:
        release.set()
        await server.stop(None)
