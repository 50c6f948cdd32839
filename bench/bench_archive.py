"""Tar transfer and suspend/resume: ours over gRPC next to raw `tar` over aiodocker exec.

Metrics (names owned by this module):
- `export_throughput`, `import_throughput`: MB/s moving a 48 MiB workspace (48 files of 1 MiB,
  random bytes) through ExportArchive / ImportArchive(replace), against `tar -c` / `tar -x`
  exec'd directly in a raw container with the same profile and the same content.
- `export_rss_growth`: peak RSS of the server during one export minus its RSS before (MiB;
  target under 16). The kernel's peak counter is reset first (`clear_refs` 5) when allowed,
  else RSS is sampled every 2 ms.
- `suspend_session`, `resume_session`: p50 ms of SuspendSession and ResumeSession for a
  session holding 1 MiB (no raw side).

Called by bench/run.py as `await run(ctx)`; usable alone with a context from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from sandboxd.v1 import common_pb2, session_pb2, snapshot_pb2, snapshot_pb2_grpc

from bench.common import (
    BenchContext,
    Metric,
    interleave,
    latency_metric,
    mb_per_s,
    throughput_metric,
    timed_ms,
)

FILES = 48
FILE_BYTES = 1024 * 1024
FILL = (
    f"i=0; while [ $i -lt {FILES} ]; do head -c {FILE_BYTES} /dev/urandom > /workspace/f$i; "
    "i=$((i+1)); done"
)
IMPORT_CHUNK = 256 * 1024
MAX_ROUNDS = 8  # 48 MiB each way per round: keep the whole module to a minute or two


async def run(ctx: BenchContext) -> dict[str, Metric]:
    rounds = min(ctx.rounds, MAX_ROUNDS)
    warmup = min(ctx.warmup, 1)
    small = BenchContext(**{**ctx.__dict__, "rounds": rounds, "warmup": warmup})
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(ctx.channel)
    results: dict[str, Metric] = {}
    # The destination has room for the new tree beside the old one, as raw tar needs none:
    # a replace that must first empty the destination is a second, slower path.
    roomy = common_pb2.ResourceLimits(workspace_bytes=128 * 1024 * 1024, memory_bytes=512 << 20)
    async with (
        ctx.session() as src,
        ctx.session(limits=roomy) as dst,
        ctx.raw_container() as raw,
    ):
        await _fill_session(ctx, src.session_id)
        code, _ = await ctx.raw_exec(raw, ["sh", "-c", FILL])
        assert code == 0, "filling the raw container failed"
        # First, before the throughput rounds have grown the server's heap.
        pid = _server_pid(ctx.address)
        if pid:
            results["export_rss_growth"] = await _rss_growth(pid, snaps, src.session_id)
        archive = await _export(snaps, src.session_id)
        total = len(archive)

        async def ours_export() -> float:
            # Counted as it streams, like the raw side (which keeps nothing either).
            start = time.perf_counter()
            n = await _export_count(snaps, src.session_id)
            return mb_per_s(n, time.perf_counter() - start)

        async def raw_export() -> float:
            start = time.perf_counter()
            _, n = await ctx.raw_exec(raw, ["tar", "-c", "-f", "-", "-C", "/workspace", "."])
            return mb_per_s(n, time.perf_counter() - start)

        ours, theirs = await interleave(small, ours_export, raw_export)
        results["export_throughput"] = throughput_metric(ours, theirs)

        async def ours_import() -> float:
            start = time.perf_counter()
            await snaps.ImportArchive(_import_requests(dst.session_id, archive))
            return mb_per_s(total, time.perf_counter() - start)

        async def raw_import() -> float:
            start = time.perf_counter()
            await _raw_import(ctx, raw, archive)
            return mb_per_s(total, time.perf_counter() - start)

        ours, theirs = await interleave(small, ours_import, raw_import)
        results["import_throughput"] = throughput_metric(ours, theirs)

    async with ctx.session() as s:
        code = await _run_sh(ctx, s.session_id, f"head -c {FILE_BYTES} /dev/urandom > one")
        assert code == 0
        suspend_ms: list[float] = []
        resume_ms: list[float] = []
        for _ in range(warmup + rounds):
            suspend_ms.append(
                await timed_ms(
                    lambda: ctx.stubs.sessions.SuspendSession(
                        session_pb2.SuspendSessionRequest(session_id=s.session_id)
                    )
                )
            )
            resume_ms.append(
                await timed_ms(
                    lambda: ctx.stubs.sessions.ResumeSession(
                        session_pb2.ResumeSessionRequest(session_id=s.session_id)
                    )
                )
            )
        results["suspend_session"] = latency_metric(suspend_ms[warmup:], None)
        results["resume_session"] = latency_metric(resume_ms[warmup:], None)
    return results


async def _run_sh(ctx: BenchContext, session_id: str, script: str) -> int:
    from sandboxd.v1 import process_pb2

    reply = await ctx.stubs.processes.Run(
        process_pb2.RunRequest(session_id=session_id, argv=["sh", "-c", script])
    )
    return int(reply.exit_code)


async def _fill_session(ctx: BenchContext, session_id: str) -> None:
    code = await _run_sh(ctx, session_id, FILL)
    assert code == 0, "filling the session failed"


async def _export(snaps: snapshot_pb2_grpc.SnapshotServiceStub, session_id: str) -> bytes:
    parts: list[bytes] = []
    call = snaps.ExportArchive(snapshot_pb2.ExportArchiveRequest(session_id=session_id))
    async for reply in call:
        parts.append(reply.chunk.data)
    return b"".join(parts)


async def _export_count(snaps: snapshot_pb2_grpc.SnapshotServiceStub, session_id: str) -> int:
    n = 0
    call = snaps.ExportArchive(snapshot_pb2.ExportArchiveRequest(session_id=session_id))
    async for reply in call:
        n += len(reply.chunk.data)
    return n


def _import_requests(
    session_id: str, archive: bytes
) -> Iterator[snapshot_pb2.ImportArchiveRequest]:
    yield snapshot_pb2.ImportArchiveRequest(
        header=snapshot_pb2.ImportArchiveHeader(session_id=session_id, replace=True)
    )
    view = memoryview(archive)
    for i in range(0, len(archive), IMPORT_CHUNK):
        yield snapshot_pb2.ImportArchiveRequest(data=bytes(view[i : i + IMPORT_CHUNK]))


async def _raw_import(ctx: BenchContext, container_id: str, archive: bytes) -> None:
    """`tar -x` fed over the exec's stdin, as a caller with aiodocker would do it."""
    container = ctx.docker.containers.container(container_id)
    execution = await container.exec(
        ["tar", "-x", "-o", "-f", "-", "-C", "/workspace"], user="65534:65534", stdin=True
    )
    async with execution.start(detach=False) as stream:
        view = memoryview(archive)
        for i in range(0, len(archive), IMPORT_CHUNK):
            await stream.write_in(bytes(view[i : i + IMPORT_CHUNK]))
        resp = stream._resp
        transport = resp.connection.transport if resp and resp.connection else None
        if transport is not None:
            transport.write_eof()
        while await stream.read_out() is not None:
            pass
    for delay in (0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2):
        if delay:
            await asyncio.sleep(delay)
        info = await execution.inspect()
        if not info.get("Running"):
            assert info.get("ExitCode") == 0, "raw tar -x failed"
            return


def _server_pid(address: str) -> int:
    """The pid listening on `address`'s port (from /proc; 0 when it cannot be found)."""
    port = int(address.rpartition(":")[2])
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                    inodes.add(fields[9])
    wanted = {f"socket:[{i}]" for i in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in wanted:
                        return int(proc.name)
    return 0


def _status_kib(pid: int, key: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(rf"^{key}:\s+(\d+)", text, re.M)
    return int(m.group(1)) if m else 0


@contextlib.asynccontextmanager
async def _sampling(pid: int) -> AsyncIterator[list[int]]:
    peak = [0]

    async def sample() -> None:
        while True:
            peak[0] = max(peak[0], _status_kib(pid, "VmRSS"))
            await asyncio.sleep(0.002)

    task = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _rss_growth(
    pid: int, snaps: snapshot_pb2_grpc.SnapshotServiceStub, session_id: str
) -> Metric:
    await asyncio.sleep(0.5)
    before = _status_kib(pid, "VmRSS")
    reset = False
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        reset = True
    async with _sampling(pid) as peak:
        await _export_count(snaps, session_id)
    hwm = _status_kib(pid, "VmHWM") if reset else 0
    growth = (max(peak[0], hwm) - before) / 1024
    return Metric(
        ours=growth,
        raw=None,
        unit="MiB",
        extra={"target_max": 16, "method": "VmHWM" if reset else "sampled VmRSS"},
    )
