"""Egress proxy cost: added connect latency and tunnel throughput, next to a direct connection.

The proxy is the server's own `EgressProxy` (same parsing, name check, static-map lookup,
address check and relay), run with a local upstream on its own event loop in a thread, as it
runs in the server process; the client is the benchmark's loop and reaches it over a loopback
listener (in a session, the agent's channel carries the connection instead; that hop is not
measured here). Raw is the same client talking to the same upstream directly, in the same
rounds. Only loopback is used.

    egress_connect_latency   open + CONNECT + first echoed byte, vs open + first echoed byte
    egress_tunnel_throughput MB/s of a download through a tunnel, vs the same download direct
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from sandboxd.egress.addresses import Protected
from sandboxd.egress.audit import AuditLog
from sandboxd.egress.policy import DEFAULT_QUOTAS, ResolvedQuotas
from sandboxd.egress.proxy import EgressProxy, Rules
from sandboxd.egress.resolver import Resolver

from bench.common import (
    BenchContext,
    Metric,
    interleave,
    latency_metric,
    mb_per_s,
    throughput_metric,
    timed_ms,
)

DOWNLOAD_BYTES = 64_000_000
CHUNK = 256 * 1024
T = TypeVar("T")


class _Host:
    """An event loop in a thread hosting the upstream and the proxy (the "server" side)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> _Host:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    async def call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(), self.loop))


async def _upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    """`e` echoes one byte back; `d` sends DOWNLOAD_BYTES then closes."""
    try:
        cmd = await r.readexactly(1)
        if cmd == b"e":
            w.write(b"e")
        else:
            block = b"x" * CHUNK
            left = DOWNLOAD_BYTES
            while left > 0:
                w.write(block[:left])
                left -= CHUNK
                await w.drain()
        await w.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        w.close()


async def run(ctx: BenchContext) -> dict[str, Metric]:
    with _Host() as host:

        async def start() -> tuple[asyncio.Server, EgressProxy, asyncio.Server, int]:
            upstream = await asyncio.start_server(_upstream, "127.0.0.1", 0)
            port = upstream.sockets[0].getsockname()[1]
            quotas = dataclasses.replace(
                ResolvedQuotas.of(DEFAULT_QUOTAS), max_bytes_down=1 << 50, max_requests=1 << 40
            )
            proxy = EgressProxy(
                "bench",
                Rules(("up.bench",), frozenset({port}), allow_private_networks=True),
                quotas,
                Resolver({"up.bench": ("127.0.0.1",)}),
                AuditLog("bench"),
                # The server never dials loopback; the benchmark's upstream can only be there.
                protected=Protected(host_addresses=frozenset, always=()),
            )
            # The proxy has no listener of its own (the server hands it each `egress` stream of
            # the agent's channel): a loopback listener hands it the benchmark's connections.
            listener = await asyncio.start_server(
                proxy.accept, "127.0.0.1", 0, limit=EgressProxy.read_limit
            )
            return upstream, proxy, listener, port

        upstream, proxy, listener, port = await host.call(start)
        proxy_address = listener.sockets[0].getsockname()[:2]
        try:
            connect = f"CONNECT up.bench:{port} HTTP/1.1\r\n\r\n".encode()

            async def open_tunnel() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
                r, w = await asyncio.open_connection(*proxy_address, limit=CHUNK)
                w.write(connect)
                status = await r.readuntil(b"\r\n\r\n")
                if not status.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"proxy refused: {status!r}")
                return r, w

            async def open_direct() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
                return await asyncio.open_connection("127.0.0.1", port, limit=CHUNK)

            def echo(opener: Callable[[], Any]) -> Callable[[], Coroutine[Any, Any, float]]:
                async def sample() -> float:
                    async def once() -> None:
                        r, w = await opener()
                        w.write(b"e")
                        await r.readexactly(1)
                        w.close()

                    return await timed_ms(once)

                return sample

            def download(opener: Callable[[], Any]) -> Callable[[], Coroutine[Any, Any, float]]:
                async def sample() -> float:
                    start = time.perf_counter()
                    r, w = await opener()
                    w.write(b"d")
                    got = 0
                    while chunk := await r.read(CHUNK):
                        got += len(chunk)
                    w.close()
                    if got != DOWNLOAD_BYTES:
                        raise RuntimeError(f"short download: {got}")
                    return mb_per_s(got, time.perf_counter() - start)

                return sample

            ours, raw = await interleave(ctx, echo(open_tunnel), echo(open_direct))
            results = {"egress_connect_latency": latency_metric(ours, raw)}
            slow = dataclasses.replace(ctx, rounds=max(3, ctx.rounds // 5), warmup=1)
            ours, raw = await interleave(slow, download(open_tunnel), download(open_direct))
            results["egress_tunnel_throughput"] = throughput_metric(ours, raw)
            return results
        finally:

            async def stop() -> None:
                listener.close()
                await proxy.close()
                upstream.close()
                await upstream.wait_closed()

            await host.call(stop)
