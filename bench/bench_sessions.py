"""Many live sessions on one host: create p50 against the live count, Run p50 on any of them,
the server's RSS and open fds against the live count, and a clean deletion of every one.

`--sessions N` (bench/run.py; default 20 so `make bench` stays quick) sets how many live
sessions the scenario grows to. It runs a server of its own (no warm pool, so every create is
a cold create+start on the engine), creates the sessions CREATORS at a time, and at each tenth of
the way (and at the end) measures: the creates' p50 in that tenth (CREATORS at once), a raw
create+start's p50 at that live count (the engine's own cost, which grows with the containers it
holds) and our CreateSession's alone beside it (one at a time, as the raw one is), the load average,
Run(["true"]) p50 over
RUN_SAMPLES sessions picked across all live ones, the server's RSS and its open fds. Then it
deletes them all (CREATORS at a time) and checks that no container of that server is left and
what the server's RSS and fds came back to. At 1,000 sessions this takes about 15 minutes on a
2-core host (most of it the engine's creates and removes); see docs/performance.md.

Metrics: `sessions_create` (p50 ms of the creates in the last tenth, i.e. near N live; raw: a
raw create+start of the same container with aiodocker at that live count),
`sessions_run_true` (Run p50 at N live; raw: the same Run with one live session),
`sessions_rss_per_session` (KiB of server RSS per live session, slope from 0 to N),
`sessions_fds_per_session` (server fds per live session), `sessions_deleted_clean` (1 when every
session was deleted and no container is left, else 0). The growth table is in the extras.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiodocker
import grpc
from sandboxd.v1 import common_pb2, process_pb2, process_pb2_grpc, session_pb2, session_pb2_grpc

from bench.common import BenchContext, Metric

CREATORS = 4
RUN_SAMPLES = 20
ALL = common_pb2.ShellPolicy(allow_all=True)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _timed_s(coro: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await coro
    return time.perf_counter() - start, result


async def _run_p50(processes: process_pb2_grpc.ProcessServiceStub, sids: list[str]) -> float:
    picked = random.sample(sids, min(RUN_SAMPLES, len(sids)))
    samples = []
    for sid in picked:
        took, resp = await _timed_s(
            processes.Run(process_pb2.RunRequest(session_id=sid, argv=["true"]))
        )
        assert resp.exit_code == 0, resp
        samples.append(took * 1000)
    return statistics.median(samples)


async def _raw_create_ms(ctx: BenchContext, n: int = 5) -> float:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        cid = await ctx.raw_create_start()
        samples.append((time.perf_counter() - start) * 1000)
        await ctx.raw_remove(cid)
    return statistics.median(samples)


async def _ours_alone_ms(sessions: session_pb2_grpc.SessionServiceStub, n: int = 3) -> float:
    """Our CreateSession with no other create in flight (then deleted), at the live count
    the raw create+start is measured at: the same conditions, so the two compare."""
    samples = []
    for _ in range(n):
        took, resp = await _timed_s(
            sessions.CreateSession(session_pb2.CreateSessionRequest(shell=ALL))
        )
        samples.append(took * 1000)
        await sessions.DeleteSession(
            session_pb2.DeleteSessionRequest(session_id=resp.session.session_id)
        )
    return statistics.median(samples)


async def _left(docker: aiodocker.Docker, owner: str) -> int:
    found = await docker.containers.list(
        all=True, filters={"label": [f"io.sandboxd.owner={owner}"]}
    )
    return len(found)


async def run(ctx: BenchContext) -> dict[str, Metric]:
    from bench.run import running_server  # noqa: PLC0415 - run imports the bench modules

    target = max(1, ctx.sessions)
    raw_create = await _raw_create_ms(ctx)
    step = max(1, target // 10)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sandboxd-bench-many-") as tmp:
        async with (
            running_server(Path(tmp), "--tenant-max-sessions", "0") as srv,
            grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel,
        ):
            sessions = session_pb2_grpc.SessionServiceStub(channel)
            processes = process_pb2_grpc.ProcessServiceStub(channel)
            pid = srv.proc.pid
            base_rss, base_fds = _rss_kib(pid), _fds(pid)
            sids: list[str] = []
            creates: list[float] = []
            failures: dict[str, int] = {}
            lock = asyncio.Lock()
            started = time.monotonic()

            async def creator(goal: int) -> None:
                while True:
                    async with lock:
                        if len(sids) + inflight[0] >= goal:
                            return
                        inflight[0] += 1
                    try:
                        took, resp = await _timed_s(
                            sessions.CreateSession(session_pb2.CreateSessionRequest(shell=ALL))
                        )
                        creates.append(took * 1000)
                        sids.append(resp.session.session_id)
                    except grpc.RpcError as exc:
                        key = f"{exc.code().name}: {str(exc.details())[:80]}"  # type: ignore[attr-defined]
                        failures[key] = failures.get(key, 0) + 1
                        if sum(failures.values()) > 20:
                            raise
                    finally:
                        inflight[0] -= 1

            inflight = [0]
            one_live_run = 0.0
            while len(sids) < target:
                goal = min(target, (len(sids) // step + 1) * step)
                before = len(creates)
                await asyncio.gather(*(creator(goal) for _ in range(CREATORS)))
                if len(sids) == 1 or (not one_live_run and sids):
                    one_live_run = await _run_p50(processes, sids[:1])
                rows.append(
                    {
                        "live": len(sids),
                        # the engine alone at this many live containers, for comparison
                        "raw_create_p50_ms": round(await _raw_create_ms(ctx, 3), 1),
                        # ours alone, in the same conditions as the raw one
                        "alone_create_p50_ms": round(await _ours_alone_ms(sessions), 1),
                        "create_p50_ms": round(statistics.median(creates[before:]), 1)
                        if creates[before:]
                        else None,
                        "run_p50_ms": round(await _run_p50(processes, sids), 2),
                        "rss_mib": round(_rss_kib(pid) / 1024, 1),
                        "fds": _fds(pid),
                        "elapsed_s": round(time.monotonic() - started, 1),
                        "load_1m": os.getloadavg()[0],
                    }
                )
                print(f"[bench_sessions] {rows[-1]}", flush=True)
                if failures and len(sids) < goal:
                    break
            top = rows[-1]
            # Delete every one, CREATORS at a time.
            deleted = 0
            queue = list(sids)
            delete_started = time.monotonic()

            async def deleter() -> None:
                nonlocal deleted
                while queue:
                    sid = queue.pop()
                    await sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
                    deleted += 1

            await asyncio.gather(*(deleter() for _ in range(CREATORS)))
            delete_s = time.monotonic() - delete_started
            await asyncio.sleep(2)
            left = await _left(ctx.docker, srv.owner)
            after_rss, after_fds = _rss_kib(pid), _fds(pid)
    live = max(1, top["live"])
    clean = deleted == len(sids) and left == 0
    extra = {
        "sessions": len(sids),
        "creators": CREATORS,
        "growth": rows,
        "failures": failures,
        "base_rss_mib": round(base_rss / 1024, 1),
        "base_fds": base_fds,
        "after_delete_rss_mib": round(after_rss / 1024, 1),
        "after_delete_fds": after_fds,
        "delete_s": round(delete_s, 1),
        "containers_left": left,
    }
    last = top["create_p50_ms"] or statistics.median(creates)
    extra["raw_create_at_zero_ms"] = round(raw_create, 1)
    return {
        "sessions_create": Metric(ours=last, raw=top["raw_create_p50_ms"], unit="ms", extra=extra),
        "sessions_run_true": Metric(ours=top["run_p50_ms"], raw=one_live_run, unit="ms"),
        "sessions_rss_per_session": Metric(
            ours=(top["rss_mib"] * 1024 - base_rss) / live, raw=None, unit="KiB"
        ),
        "sessions_fds_per_session": Metric(
            ours=(top["fds"] - base_fds) / live, raw=None, unit="fd"
        ),
        "sessions_deleted_clean": Metric(ours=1.0 if clean else 0.0, raw=None, unit="bool"),
    }
