"""Where the fair shares act: the call admission interceptor on a real in-process gRPC server
(a flooding tenant refused with RetryInfo before its handler runs, the other tenant served), and
an agent channel's reader held by its tenant's pacer (what arrives meanwhile stays in the pipe).
Deterministic: a fake clock, and the channel's pause replaced by an event the test releases."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import grpc
import pytest
from agent_peer import ScriptedAgent
from google.rpc import error_details_pb2, status_pb2
from sandboxd import tenancy
from sandboxd.admission import FairShares, Shares
from sandboxd.agent import channel as channel_mod
from sandboxd.agent.channel import Channel
from sandboxd.agent.exec_stream import exec_request
from sandboxd.api import admission as admission_mod
from sandboxd.api.admission import CallAdmission
from sandboxd.api.auth import AuthInterceptor

TOKENS = {"flood": "flood-token", "calm": "calm-token"}
SHARES = Shares(calls_per_s=10, call_burst=3, window_s=1)


class Clock:
    now = 50.0

    def __call__(self) -> float:
        return self.now


def _table() -> tenancy.TokenTable:
    return tenancy.TokenTable(
        tuple((t, hashlib.sha256(tok.encode()).digest()) for t, tok in TOKENS.items())
    )


async def _serve(shares: FairShares, ran: list[str]) -> tuple[grpc.aio.Server, int]:
    async def unary(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        ran.append(tenancy.current())
        return b"ok"

    async def stream(
        request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        ran.append(tenancy.current())
        yield b"a"
        yield b"b"

    server = grpc.aio.server(interceptors=[AuthInterceptor(_table()), CallAdmission(shares)])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "t.S",
                {
                    "Unary": grpc.unary_unary_rpc_method_handler(unary),
                    "Stream": grpc.unary_stream_rpc_method_handler(stream),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def _retry_delay_ns(err: grpc.aio.AioRpcError) -> tuple[str, int]:
    (raw,) = [v for k, v in err.trailing_metadata() or () if k == "grpc-status-details-bin"]
    reason, delay = "", -1
    for detail in status_pb2.Status.FromString(raw).details:
        info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
        if detail.Unpack(info) if detail.Is(info.DESCRIPTOR) else False:
            reason = info.reason
        if detail.Unpack(retry) if detail.Is(retry.DESCRIPTOR) else False:
            delay = retry.retry_delay.ToNanoseconds()
    return reason, delay


async def test_the_flooding_tenant_is_refused_with_retry_info_and_the_other_is_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held: list[float] = []

    async def recorded(seconds: float) -> None:
        held.append(seconds)

    monkeypatch.setattr(admission_mod, "hold", recorded)
    clock, ran = Clock(), []
    server, port = await _serve(FairShares(SHARES, clock), ran)
    md = {t: (("authorization", f"Bearer {tok}"),) for t, tok in TOKENS.items()}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            unary, stream = channel.unary_unary("/t.S/Unary"), channel.unary_stream("/t.S/Stream")
            assert await unary(b"", metadata=md["calm"], timeout=10) == b"ok"
            for _ in range(SHARES.call_burst):
                assert await unary(b"", metadata=md["flood"], timeout=10) == b"ok"
            for call in (
                lambda: unary(b"", metadata=md["flood"], timeout=10),
                lambda: stream(b"", metadata=md["flood"], timeout=10).read(),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call()
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert _retry_delay_ns(err.value) == ("TENANT_RATE_LIMITED", 1_000_000)
            assert await unary(b"", metadata=md["calm"], timeout=10) == b"ok"
            got = [m async for m in stream(b"", metadata=md["calm"], timeout=10)]
            assert got == [b"a", b"b"]
            # The refused calls never reached their handler; each was held first, the second
            # longer (two token intervals at 10/s).
            assert ran == ["calm", "flood", "flood", "flood", "calm", "calm"]
            assert held == pytest.approx([0.1, 0.2])
    finally:
        await server.stop(None)


async def test_a_paced_channel_leaves_what_comes_next_in_the_pipe_until_its_pause_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []
    release = asyncio.Event()

    async def held(seconds: float) -> None:
        pauses.append(seconds)
        await release.wait()

    monkeypatch.setattr(channel_mod, "pause", held)
    paced: list[int] = []
    armed = False

    def pace(nbytes: int) -> float:
        paced.append(nbytes)
        return 3600.0 if armed else 0.0

    agent = ScriptedAgent()
    channel = Channel(agent.transport, name="t", window=1 << 16, handshake_s=2, pace=pace)
    starting = asyncio.create_task(channel.start())
    await agent.handshake()
    await starting
    try:
        request = exec_request(["yes"], base_env={}, env={}, workdir=None, stdin=False, tty=False)
        opening = asyncio.create_task(channel.open("exec", request))
        sid, _ = await agent.accept_open()
        stream = await opening
        armed = True
        agent.output(sid, b"first")
        assert await asyncio.wait_for(stream.read(), 2) == (1, b"first")
        agent.output(sid, b"second")
        for _ in range(20):
            await asyncio.sleep(0)
        assert pauses == [channel_mod.MAX_PAUSE_S]  # one pause, capped
        assert agent.transport.to_server.qsize() == 1  # "second" is still in the pipe
        armed = False
        release.set()
        assert await asyncio.wait_for(stream.read(), 2) == (1, b"second")
        # Every chunk read was reported with its size (a DATA frame: its header and payload).
        assert paced[-2] > len(b"first") and paced[-1] > len(b"second")
    finally:
        release.set()
        await channel.close()


async def test_a_held_refusal_is_answered_before_the_callers_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refusals in a row are held up to a second, but never past the caller's deadline: the
    caller gets TENANT_RATE_LIMITED with its RetryInfo, not DEADLINE_EXCEEDED."""
    held: list[float] = []

    async def recorded(seconds: float) -> None:
        held.append(seconds)

    monkeypatch.setattr(admission_mod, "hold", recorded)
    clock, ran = Clock(), []
    server, port = await _serve(FairShares(SHARES, clock), ran)
    md = {t: (("authorization", f"Bearer {tok}"),) for t, tok in TOKENS.items()}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            unary = channel.unary_unary("/t.S/Unary")
            assert await unary(b"", metadata=md["calm"], timeout=10) == b"ok"
            for _ in range(SHARES.call_burst):
                assert await unary(b"", metadata=md["flood"], timeout=10) == b"ok"
            for _ in range(12):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await unary(b"", metadata=md["flood"], timeout=0.5)
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert held[:3] == pytest.approx([0.1, 0.2, 0.3])
            assert max(held) < 0.47  # from the 5th on, cut to the deadline less its margin
            assert max(held) > 0.3
    finally:
        await server.stop(None)
