"""Fair shares: a bystander tenant's Run(["true"]) p50 while another tenant floods the server.

A server of its own, with a tokens file of two tenants and its default admission settings. The
bystander has one session; the flooding tenant has `FLOOD_SESSIONS` and runs
`bench/fairness_flood.py` in a separate process (start storms of StartProcess `yes`, Exec
output floods, AttachProcess readers, a Run storm; see that file), so the flood's client work
never shares the bystander's event loop.

Reported as `fairness_bystander_run`: "ours" is the bystander's p50 under the flood, "raw" the
same bystander's p50 on the same server with no flood, measured just before; the ratio is the
slowdown the flood caused (target: at most 2x). Extras: the p95s, what the flood got done and
how often it was refused (by status and reason, and how many refusals carried RetryInfo), and
the server's CPU seconds during the flood.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from sandboxd.v1 import common_pb2, process_pb2, process_pb2_grpc, session_pb2, session_pb2_grpc

from bench.common import BenchContext, Metric, percentile, timed_ms

FLOOD_SESSIONS = 4
# The flooding tenant asks for the most every session may have (the server's maxima).
FLOOD_LIMITS = common_pb2.ResourceLimits(
    cpu_millis=2000, pids=512, output_bytes=16 * 1024 * 1024, memory_bytes=512 * 1024 * 1024
)
FLOOD_SECONDS = 25.0
SETTLE_S = 3.0  # the flood builds up before the bystander measures
# The bystander starts a Run every 40 ms at most: an ordinary tenant at 25 calls/s, half of
# admission_calls_per_s (50), not a second flood. A fixed pause after each call would let a fast,
# quiet host push it past its share, and its refusals would then be measured as the flood's harm.
BYSTANDER_PERIOD_S = 0.04
ALL = common_pb2.ShellPolicy(allow_all=True)
# SANDBOXD_BENCH_FLOOD_ISOLATION=gvisor: the flood's sessions on the gVisor tier (the
# bystander's on the server's default).
FLOOD_ISOLATION = (
    common_pb2.ISOLATION_GVISOR
    if os.environ.get("SANDBOXD_BENCH_FLOOD_ISOLATION") == "gvisor"
    else None
)


def _tokens(path: Path) -> dict[str, str]:
    import hashlib  # noqa: PLC0415

    tokens = {"flood": "f-" + secrets.token_urlsafe(16), "calm": "c-" + secrets.token_urlsafe(16)}
    path.write_text(
        "".join(f"{t} {hashlib.sha256(tok.encode()).hexdigest()}\n" for t, tok in tokens.items())
    )
    return tokens


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _bystander(
    processes: process_pb2_grpc.ProcessServiceStub, md: Any, sid: str, n: int, until: float
) -> list[float]:
    async def call() -> None:
        resp = await processes.Run(
            process_pb2.RunRequest(session_id=sid, argv=["true"]), metadata=md
        )
        assert resp.exit_code == 0, resp

    samples: list[float] = []
    while len(samples) < n and time.monotonic() < until:
        started = time.monotonic()
        samples.append(await timed_ms(call))
        await asyncio.sleep(max(0.0, BYSTANDER_PERIOD_S - (time.monotonic() - started)))
    return samples


async def _share_series(port: int) -> dict[str, float]:
    """The server's fair-share series (refused calls, paced seconds) by tenant."""
    import aiohttp  # noqa: PLC0415

    url = f"http://127.0.0.1:{port}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        text = await resp.text()
    return {
        line.split(" ")[0].removeprefix("sandboxd_fair_share_"): round(float(line.split()[-1]), 2)
        for line in text.splitlines()
        if line.startswith("sandboxd_fair_share_") and "_created" not in line.split(" ")[0]
    }


async def run(ctx: BenchContext) -> dict[str, Metric]:
    from bench.run import running_server  # noqa: PLC0415 - run imports the bench modules

    rounds = max(ctx.rounds, 30) * 2
    with tempfile.TemporaryDirectory(prefix="sandboxd-bench-fair-") as tmp:
        tokens = _tokens(Path(tmp) / "tokens")
        async with (
            running_server(Path(tmp) / "data", "--tokens-file", str(Path(tmp) / "tokens")) as srv,
            grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel,
        ):
            sessions = session_pb2_grpc.SessionServiceStub(channel)
            processes = process_pb2_grpc.ProcessServiceStub(channel)
            md = {t: (("authorization", f"Bearer {tok}"),) for t, tok in tokens.items()}
            made: list[tuple[str, str]] = []
            try:
                for tenant, count in (("calm", 1), ("flood", FLOOD_SESSIONS)):
                    limits = FLOOD_LIMITS if tenant == "flood" else None
                    tier = FLOOD_ISOLATION if tenant == "flood" else None
                    for _ in range(count):
                        resp = await sessions.CreateSession(
                            session_pb2.CreateSessionRequest(
                                shell=ALL, limits=limits, isolation=tier
                            ),
                            metadata=md[tenant],
                        )
                        made.append((tenant, resp.session.session_id))
                calm_sid = made[0][1]
                flood_sids = [sid for tenant, sid in made if tenant == "flood"]
                for _ in range(ctx.warmup * 3):
                    await _bystander(processes, md["calm"], calm_sid, 1, time.monotonic() + 30)
                quiet = await _bystander(
                    processes, md["calm"], calm_sid, rounds, time.monotonic() + 60
                )
                flood = await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(Path(__file__).with_name("fairness_flood.py")),
                    f"127.0.0.1:{srv.port}",
                    tokens["flood"],
                    ",".join(flood_sids),
                    str(FLOOD_SECONDS),
                    os.environ.get("SANDBOXD_BENCH_FLOOD", "all"),
                    stdout=asyncio.subprocess.PIPE,
                )
                try:
                    await asyncio.sleep(SETTLE_S)
                    cpu0, t0 = _cpu_s(srv.proc.pid), time.monotonic()
                    # For as long as the flood lasts: the shares bind only while the bystander
                    # is active, so it is active throughout.
                    loud = await _bystander(
                        processes,
                        md["calm"],
                        calm_sid,
                        100_000,
                        time.monotonic() + FLOOD_SECONDS - SETTLE_S - 1,
                    )
                    cpu = _cpu_s(srv.proc.pid) - cpu0
                    wall = time.monotonic() - t0
                    out, _ = await asyncio.wait_for(flood.communicate(), FLOOD_SECONDS + 60)
                finally:
                    if flood.returncode is None:
                        flood.kill()
                        await flood.wait()
                counts = json.loads(out.decode().strip().splitlines()[-1] or "{}")
                counts.pop("messages", None)
                shares = await _share_series(srv.metrics_port)
            finally:
                for tenant, sid in made:
                    with contextlib.suppress(grpc.RpcError):
                        await sessions.DeleteSession(
                            session_pb2.DeleteSessionRequest(session_id=sid), metadata=md[tenant]
                        )
    metric = Metric(
        ours=statistics.median(loud),
        raw=statistics.median(quiet),
        unit="ms",
        extra={
            "ours_p95": round(percentile(loud, 95), 3),
            "raw_p95": round(percentile(quiet, 95), 3),
            "samples": len(loud),
            "flood": counts,
            "fair_share_series": shares,
            "server_cpu_share_during_flood": round(cpu / wall, 2) if wall else None,
        },
    )
    return {"fairness_bystander_run": metric}
