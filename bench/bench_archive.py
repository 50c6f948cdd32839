"""Tar transfer and suspend/resume: ours over gRPC next to raw `tar` over aiodocker exec.

Metrics (names owned by this module):
- `export_throughput`, `import_throughput`: MB/s moving a 48 MiB workspace (48 files of 1 MiB,
  random bytes) through ExportArchive / ImportArchive(replace), against `tar -c` / `tar -x`
  exec'd directly in a raw container with the same profile and the same content.
- `export_random_zstd_throughput`, `export_tree_throughput`, `export_tree_zstd_throughput`
  and the same three `import_...`: the same random bytes compressed, and a generated source
  tree (about 36 MiB, 1600 files; archive_mix.py) plain and compressed; MB/s of the plain
  tar each carries, against raw plain `tar` of the same content, with `wire_bytes` (what
  crossed gRPC per call), `tar_bytes`, `raw_wire_bytes` and `server_cpu_ms` (the server's
  CPU per call, median: what compares on a loaded machine) in the row.
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
from collections.abc import AsyncIterator
from pathlib import Path

from sandboxd.v1 import common_pb2, session_pb2, snapshot_pb2_grpc

from bench import archive_mix
from bench.common import BenchContext, Metric, latency_metric, timed_ms

FILES = 48
FILE_BYTES = 1024 * 1024
FILL = (
    f"i=0; while [ $i -lt {FILES} ]; do head -c {FILE_BYTES} /dev/urandom > /workspace/f$i; "
    "i=$((i+1)); done"
)
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
        ctx.session() as tree_src,
        ctx.session(limits=roomy) as dst,
        ctx.raw_container() as raw,
        ctx.raw_container() as raw_tree,
    ):
        await _fill_session(ctx, src.session_id)
        code, _ = await ctx.raw_exec(raw, ["sh", "-c", FILL])
        assert code == 0, "filling the raw container failed"
        tree = archive_mix.tree_tar()
        await snaps.ImportArchive(archive_mix.import_requests(tree_src.session_id, tree))
        await archive_mix.raw_import(ctx, raw_tree, tree)
        # First, before the throughput rounds have grown the server's heap.
        pid = _server_pid(ctx.address)
        if pid:
            results["export_rss_growth"] = await _rss_growth(pid, snaps, src.session_id)
        for content in (
            archive_mix.Content("random", src.session_id, raw),
            archive_mix.Content("tree", tree_src.session_id, raw_tree),
        ):
            results.update(await archive_mix.measure(small, snaps, content, dst.session_id))

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
        await archive_mix.export_count(snaps, session_id)
    hwm = _status_kib(pid, "VmHWM") if reset else 0
    growth = (max(peak[0], hwm) - before) / 1024
    return Metric(
        ours=growth,
        raw=None,
        unit="MiB",
        extra={"target_max": 16, "method": "VmHWM" if reset else "sampled VmRSS"},
    )
