"""Interactive and background processes next to raw aiodocker exec, in the same rounds.

- `interact_round_trip`: one stdin byte to its echo on an open Interact stream running `cat`,
  against the same on a raw `docker exec -i cat` stream (p50 ms; target ratio at most 1.0).
  Its extras are two gRPC floors (p50 ms, sampled right after, as many as the round trip):
  `grpc_bidi_floor_p50`, one byte to its echo on an open bidi stream of a bare grpc.aio echo
  server in a child process (the same library, the same client and request pattern, no
  sandbox work: the least any gRPC round trip of this client costs), and
  `grpc_unary_floor_p50`, a unary health check of this server (a new HTTP/2 stream per call,
  which an open Interact does not pay).
- `interact_stdout_throughput`: a 16 MB stdout stream through Interact, against a raw exec
  streaming the same command (median MB/s; target ratio at least 1.0).
- `attach_process_throughput`: a 16 MB background process followed live with AttachProcess
  from its start (StartProcess included), against a raw exec streaming the same command
  (median MB/s; target ratio at least 1.0).

Both sides run in the same session profile and image; the raw exec runs as the session's uid.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sandboxd.v1 import common_pb2, process_pb2

from bench.common import (
    BenchContext,
    Metric,
    Sample,
    interleave,
    latency_metric,
    mb_per_s,
    throughput_metric,
    timed_ms,
)

P = process_pb2
STREAM_BYTES = 16 * 1000 * 1000
SIXTEEN_MIB = 16 * 1024 * 1024
_PRODUCE = ["head", "-c", str(STREAM_BYTES), "/dev/zero"]
_ZEROS = bytes(1 << 20)  # what _PRODUCE writes, to check an output event against (1.5 us)


class _Requests:
    """Requests of an aio Interact call, fed from a queue."""

    def __init__(self, first: P.InteractRequest) -> None:
        self.queue: asyncio.Queue[P.InteractRequest | None] = asyncio.Queue()
        self.queue.put_nowait(first)

    def __aiter__(self) -> AsyncIterator[P.InteractRequest]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[P.InteractRequest]:
        while (item := await self.queue.get()) is not None:
            yield item


def _start(session_id: str, argv: list[str]) -> P.InteractRequest:
    request = P.ExecRequest(
        session_id=session_id, argv=argv, timeout=duration_pb2.Duration(seconds=600)
    )
    return P.InteractRequest(start=P.InteractStart(request=request))


@contextlib.asynccontextmanager
async def interact_echo(ctx: BenchContext, session_id: str) -> AsyncIterator[Sample]:
    """An open Interact stream running `cat`; each sample writes one byte and awaits its echo."""
    requests = _Requests(_start(session_id, ["cat"]))
    call = ctx.stubs.processes.Interact(requests)
    try:
        first = await call.read()
        assert first.HasField("started"), first

        async def ours() -> float:
            start = time.perf_counter()
            requests.queue.put_nowait(P.InteractRequest(stdin=P.InteractStdin(data=b"x")))
            while True:
                event = await call.read()
                if event.HasField("output"):
                    return (time.perf_counter() - start) * 1000

        yield ours
    finally:
        requests.queue.put_nowait(P.InteractRequest(close_stdin=P.InteractCloseStdin()))
        requests.queue.put_nowait(None)
        call.cancel()


@contextlib.asynccontextmanager
async def raw_echo(ctx: BenchContext, container_id: str) -> AsyncIterator[Sample]:
    """The same over a raw `docker exec -i cat` (as the session's uid)."""
    raw_exec = await ctx.docker.containers.container(container_id).exec(
        ["cat"], stdin=True, user="65534:65534"
    )
    raw = raw_exec.start(detach=False)
    await raw._init()
    try:

        async def theirs() -> float:
            start = time.perf_counter()
            await raw.write_in(b"x")
            await raw.read_out()
            return (time.perf_counter() - start) * 1000

        yield theirs
    finally:
        await raw.close()


_ECHO = "/bench.Echo/Echo"


def _same(message: bytes) -> bytes:
    return message


async def _serve_echo(container_id: str | None) -> None:
    """A bare grpc.aio bidi echo server (what `--echo-server` runs in the child process); with
    a container, each message goes through a raw `docker exec -i cat` there and back."""
    relay: Any = None
    if container_id:
        import aiodocker

        docker = aiodocker.Docker()
        exec_ = await docker.containers.container(container_id).exec(
            ["cat"], stdin=True, user="65534:65534"
        )
        relay = exec_.start(detach=False)
        await relay._init()

    async def echo(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        async for message in requests:
            if relay is not None:
                await relay.write_in(message)
                message = bytes((await relay.read_out()).data)
            yield message

    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(echo, _same, _same)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bench.Echo", {"Echo": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


@contextlib.asynccontextmanager
async def bare_echo(container_id: str | None = None) -> AsyncIterator[Sample]:
    """An open bidi stream to a bare echo server in a child process (relaying through a raw
    `docker exec -i cat` in `container_id`, if given); each sample sends one byte the way
    `interact_echo` does (a queue-fed request iterator) and awaits its echo."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.bench_processes",
        "--echo-server",
        *([container_id] if container_id else []),
        cwd=Path(__file__).resolve().parents[1],
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        port = int(await asyncio.wait_for(child.stdout.readline(), 30))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            queue: asyncio.Queue[bytes | None] = asyncio.Queue()

            async def requests() -> AsyncIterator[bytes]:
                while (item := await queue.get()) is not None:
                    yield item

            call = channel.stream_stream(_ECHO, _same, _same)(requests())

            async def echo() -> float:
                start = time.perf_counter()
                queue.put_nowait(b"x")
                await call.read()
                return (time.perf_counter() - start) * 1000

            try:
                yield echo
            finally:
                queue.put_nowait(None)
                call.cancel()
    finally:
        child.kill()
        await child.wait()


async def _round_trip(ctx: BenchContext, session_id: str, container_id: str) -> Metric:
    async with interact_echo(ctx, session_id) as ours, raw_echo(ctx, container_id) as theirs:
        o, r = await interleave(ctx, ours, theirs)
    metric = latency_metric(o, r)
    # For the reading, as many samples right after: a bare bidi echo's round trip (the floor of
    # any gRPC stream round trip of this client) and a unary health check through this server.
    samples = range(ctx.warmup + ctx.rounds)
    async with bare_echo() as bare:
        bidi = [await bare() for _ in samples][ctx.warmup :]
    metric.extra["grpc_bidi_floor_p50"] = round(statistics.median(bidi), 3)
    async with bare_echo(container_id) as relayed:
        through = [await relayed() for _ in samples][ctx.warmup :]
    metric.extra["grpc_exec_floor_p50"] = round(statistics.median(through), 3)
    health = health_pb2_grpc.HealthStub(ctx.channel)
    unary = [
        await timed_ms(lambda: health.Check(health_pb2.HealthCheckRequest())) for _ in samples
    ][ctx.warmup :]
    metric.extra["grpc_unary_floor_p50"] = round(statistics.median(unary), 3)
    return metric


async def _raw_stream(ctx: BenchContext, container_id: str) -> float:
    start = time.perf_counter()
    _, received = await ctx.raw_exec(container_id, _PRODUCE)
    assert received == STREAM_BYTES, received
    return mb_per_s(received, time.perf_counter() - start)


async def _interact_stream(ctx: BenchContext, session_id: str) -> float:
    requests = _Requests(_start(session_id, _PRODUCE))
    requests.queue.put_nowait(P.InteractRequest(close_stdin=P.InteractCloseStdin()))
    requests.queue.put_nowait(None)
    start = time.perf_counter()
    received = 0
    async for event in ctx.stubs.processes.Interact(requests):
        if event.HasField("output"):
            received += len(event.output.data)
    assert received == STREAM_BYTES, received
    return mb_per_s(received, time.perf_counter() - start)


async def _attach_stream(ctx: BenchContext, session_id: str) -> float:
    start = time.perf_counter()
    started = await ctx.stubs.processes.StartProcess(
        P.StartProcessRequest(
            session_id=session_id,
            argv=_PRODUCE,
            max_output_bytes=SIXTEEN_MIB,
            timeout=duration_pb2.Duration(seconds=600),
        )
    )
    received = 0
    exit_code: int | None = None
    attach = P.AttachProcessRequest(session_id=session_id, process_id=started.process.process_id)
    async for event in ctx.stubs.processes.AttachProcess(attach):
        if event.HasField("output"):
            # Every byte, once, in order, as written (/dev/zero): a short or misplaced read
            # fails the bench loudly rather than passing for a fast one.
            out = event.output
            if out.offset != received or out.stream != P.OUTPUT_STREAM_STDOUT:
                raise AssertionError(f"output at {out.offset} after {received} bytes: {out}")
            if out.data != _ZEROS[: len(out.data)]:
                raise AssertionError(f"output at {out.offset} is not what was written")
            received += len(out.data)
        elif event.HasField("gap"):
            raise AssertionError(f"unexpected gap {event.gap}")
        elif event.HasField("exited"):
            exit_code = event.exited.exit_code
    if received != STREAM_BYTES or exit_code != 0:
        raise AssertionError(
            f"AttachProcess got {received} of {STREAM_BYTES} bytes, exit {exit_code}"
        )
    return mb_per_s(received, time.perf_counter() - start)


async def run(ctx: BenchContext) -> dict[str, Metric]:
    metrics: dict[str, Metric] = {}
    limits = common_pb2.ResourceLimits(output_bytes=SIXTEEN_MIB)
    async with ctx.session(limits=limits) as session, ctx.raw_container() as cid:
        sid = session.session_id
        metrics["interact_round_trip"] = await _round_trip(ctx, sid, cid)
        o, r = await interleave(
            ctx, lambda: _interact_stream(ctx, sid), lambda: _raw_stream(ctx, cid)
        )
        metrics["interact_stdout_throughput"] = throughput_metric(o, r)
        o, r = await interleave(
            ctx, lambda: _attach_stream(ctx, sid), lambda: _raw_stream(ctx, cid)
        )
        metrics["attach_process_throughput"] = throughput_metric(o, r)
    return metrics


if __name__ == "__main__" and sys.argv[1:2] == ["--echo-server"]:
    asyncio.run(_serve_echo(sys.argv[2] if len(sys.argv) > 2 else None))
