"""The E2B door: the official SDK's `commands.run("true")` next to sandboxd's own gRPC Run of the
same command line on the same sandbox, in the same rounds.

- `e2b_run_true`: the SDK's call (timed inside the SDK's process: REST-free, one envd Start
  stream through the door: StartProcess + AttachProcess over loopback gRPC), against
  `ProcessService.Run` of `/bin/bash -l -c true` (what the SDK runs) from this process. The
  ratio is the door's cost plus the SDK's own; `grpc_run_true_p50_ms` (argv `true`, no shell)
  rides along.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from sandboxd.v1 import process_pb2

from bench.common import BenchContext, Metric, interleave, latency_metric

REPO = Path(__file__).resolve().parents[1]
SDK_PYTHON = REPO / "build" / "e2b-venv" / "bin" / "python"


async def run(ctx: BenchContext) -> dict[str, Metric]:
    if not ctx.e2b_url or not SDK_PYTHON.exists():
        raise RuntimeError("needs the E2B door and build/e2b-venv (make e2b-sdk)")
    proc = await asyncio.create_subprocess_exec(
        str(SDK_PYTHON),
        str(REPO / "bench" / "e2b_driver.py"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={
            "PATH": os.environ.get("PATH", ""),
            "E2B_API_URL": ctx.e2b_url,
            "E2B_SANDBOX_URL": ctx.e2b_url,
            "E2B_API_KEY": "bench",
        },
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    try:
        sid = (await asyncio.wait_for(stdout.readline(), 120)).decode().strip()

        async def ours() -> float:
            stdin.write(b"run\n")
            await stdin.drain()
            return float(await asyncio.wait_for(stdout.readline(), 60)) * 1000

        async def grpc_run(argv: list[str]) -> float:
            start = time.perf_counter()
            await ctx.stubs.processes.Run(process_pb2.RunRequest(session_id=sid, argv=argv))
            return (time.perf_counter() - start) * 1000

        ours_ms, raw_ms = await interleave(
            ctx, ours, lambda: grpc_run(["/bin/bash", "-l", "-c", "true"])
        )
        plain = sorted([await grpc_run(["true"]) for _ in range(ctx.rounds)])
        metric = latency_metric(ours_ms, raw_ms)
        metric.extra["grpc_run_true_p50_ms"] = round(plain[len(plain) // 2], 3)
        return {"e2b_run_true": metric}
    finally:
        stdin.write(b"quit\n")
        await stdin.drain()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
