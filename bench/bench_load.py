"""Load: Run(["true"]) from many callers at once, with the CPU each process spent per Run.

Wall throughput on a shared machine says as much about the neighbours as about us, so the
primary figure is CPU time per Run, read from /proc/<pid>/stat (utime+stime) of each process on
the command's path:

- server: the sandboxd process;
- agent: each session's PID 1 (the in-sandbox agent);
- command: the `true` commands it forked and reaped (its cutime + cstime);
- shim: each session's containerd-shim (the container's stdio relay);
- dockerd: the engine's daemon, which relays the agent's attached stdio. It is shared with
  everything else on the machine, so its figure includes the neighbours' work;
- client: this bench process (the load's gRPC client).

`host` is server + agent + command + shim + dockerd, the "host CPU per Run" (the client is
counted apart). Runs/s, p50 and p99 are reported as measured, with the machine's load average beside
them. The raw side is the same load as `docker exec true` on raw containers (the engine's own
path), at the same concurrency.

Knobs (environment): SANDBOXD_BENCH_LOAD_SECONDS (default 10), SANDBOXD_BENCH_LOAD_CALLERS
(concurrent callers, default 16), SANDBOXD_BENCH_LOAD_SESSIONS (sessions they share, default 2),
SANDBOXD_BENCH_LOAD_RATE (Runs started per second, 0: as fast as the callers go),
SANDBOXD_BENCH_LOAD_ARGV (the command, default `true`), SANDBOXD_BENCH_LOAD_RAW=0 (ours
only: for comparing two builds of the server back to back).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sandboxd.v1 import process_pb2

from bench.common import BenchContext, Metric, percentile

_TICK = os.sysconf("SC_CLK_TCK")


def _seconds_of(pid: int, *, children: bool = False) -> float:
    """CPU seconds of one process (user + system), or of its reaped children if asked."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw.rpartition(")")[2].split()  # after "(comm)", which may hold spaces
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    ticks = cutime + cstime if children else utime + stime
    return ticks / _TICK


def _ppid(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw.rpartition(")")[2].split()[1])


def _pids_named(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
    return found


class CpuMeter:
    """Per-role CPU seconds over one window, from /proc of each pid in the role."""

    def __init__(self, roles: dict[str, list[tuple[int, bool]]]) -> None:
        self._roles = roles
        self._start: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        now = {
            role: sum(_seconds_of(pid, children=kids) for pid, kids in pids)
            for role, pids in self._roles.items()
        }
        now["client"] = time.process_time()
        return now

    def start(self) -> None:
        self._start = self._now()

    def spent(self) -> dict[str, float]:
        end = self._now()
        return {role: end[role] - self._start[role] for role in end}


async def _container_pids(
    ctx: BenchContext, container_ids: list[str]
) -> tuple[list[tuple[int, bool]], list[tuple[int, bool]], list[tuple[int, bool]]]:
    """(agents, the commands they reaped, shims) of the containers."""
    agents, commands, shims = [], [], []
    for cid in container_ids:
        info = await ctx.docker.containers.container(cid).show()
        pid = int(info["State"]["Pid"])
        agents.append((pid, False))
        commands.append((pid, True))
        shims.append((_ppid(pid), False))
    return agents, commands, shims


def _session_containers(ctx: BenchContext, session_ids: list[str]) -> list[str]:
    """Each session's container id, from the server's session records (read-only: a pool
    container claimed by a session carries no label naming it)."""
    uri = f"file:{ctx.data_dir / 'sessions.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        return [
            db.execute("SELECT container_id FROM sessions WHERE session_id = ?", (sid,)).fetchone()[
                0
            ]
            for sid in session_ids
        ]


async def _drive(
    call: Callable[[int], Awaitable[None]], callers: int, seconds: float, rate: float = 0.0
) -> tuple[int, list[float], float]:
    """`callers` loops calling `call(i)` until the deadline: (count, latencies ms, wall s).
    With a `rate`, the calls together start at most that many per second (an open-loop pace:
    CPU per call then compares across builds at the same load, whatever the neighbours do)."""
    latencies: list[float] = []
    started = time.monotonic()
    deadline = started + seconds
    slots = iter(range(1 << 62))

    async def loop(i: int) -> None:
        while time.monotonic() < deadline:
            if rate:
                due = started + next(slots) / rate
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
            t0 = time.perf_counter()
            await call(i)
            latencies.append((time.perf_counter() - t0) * 1000)

    async with asyncio.TaskGroup() as tg:
        for i in range(callers):
            tg.create_task(loop(i))
    return len(latencies), latencies, time.monotonic() - started


def _summary(
    count: int, latencies: list[float], wall: float, spent: dict[str, float]
) -> dict[str, Any]:
    per_run = {role: round(s * 1000 / max(count, 1), 3) for role, s in spent.items()}
    per_run["host"] = round(
        sum(per_run.get(r, 0.0) for r in ("server", "agent", "command", "shim", "dockerd")), 3
    )
    return {
        "runs": count,
        "runs_per_s": round(count / wall, 1),
        "p50_ms": round(percentile(latencies, 50), 3) if latencies else None,
        "p99_ms": round(percentile(latencies, 99), 3) if latencies else None,
        "cpu_ms_per_run": per_run,
    }


async def _raw_load(
    ctx: BenchContext,
    callers: int,
    n_sessions: int,
    seconds: float,
    dockerd: list[tuple[int, bool]],
) -> dict[str, Any]:
    """The same callers, `docker exec true` on raw containers with the session profile."""
    async with contextlib.AsyncExitStack() as stack:
        cids = [await stack.enter_async_context(ctx.raw_container()) for _ in range(n_sessions)]
        raw_agents, _, raw_shims = await _container_pids(ctx, cids)

        async def raw(i: int) -> None:
            code, _ = await ctx.raw_exec(cids[i % n_sessions], ["true"])
            if code != 0:
                raise RuntimeError(f"raw true exited {code}")

        raw_seconds = max(2.0, seconds / 3)  # the raw path is slow: a shorter window
        meter = CpuMeter({"agent": raw_agents, "shim": raw_shims, "dockerd": dockerd})
        meter.start()
        count, lat, wall = await _drive(raw, callers, raw_seconds)
        return _summary(count, lat, wall, meter.spent())


async def run(ctx: BenchContext) -> dict[str, Metric]:
    seconds = float(os.environ.get("SANDBOXD_BENCH_LOAD_SECONDS", "10"))
    callers = int(os.environ.get("SANDBOXD_BENCH_LOAD_CALLERS", "16"))
    n_sessions = int(os.environ.get("SANDBOXD_BENCH_LOAD_SESSIONS", "2"))
    rate = float(os.environ.get("SANDBOXD_BENCH_LOAD_RATE", "0"))
    dockerd = [(pid, False) for pid in _pids_named("dockerd")]
    results: dict[str, Metric] = {}
    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(ctx.session()) for _ in range(n_sessions)]
        sids = [s.session_id for s in sessions]
        agents, commands, shims = await _container_pids(ctx, _session_containers(ctx, sids))
        argv = os.environ.get("SANDBOXD_BENCH_LOAD_ARGV", "true").split()
        requests = [process_pb2.RunRequest(session_id=sid, argv=argv) for sid in sids]

        async def ours(i: int) -> None:
            resp = await ctx.stubs.processes.Run(requests[i % n_sessions])
            if resp.exit_code != 0:
                raise RuntimeError(f"true exited {resp.exit_code}")

        await _drive(ours, callers, 1.0)  # warm-up
        meter = CpuMeter(
            {
                "server": [(ctx.server_pid, False)],
                "agent": agents,
                "command": commands,
                "shim": shims,
                "dockerd": dockerd,
            }
        )
        load_before = os.getloadavg()[0]
        meter.start()
        count, lat, wall = await _drive(ours, callers, seconds, rate)
        ours_summary = _summary(count, lat, wall, meter.spent())
        ours_summary["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]

    raw_summary: dict[str, Any] = {"runs_per_s": None, "p50_ms": None, "p99_ms": None}
    raw_summary["cpu_ms_per_run"] = {}
    if os.environ.get("SANDBOXD_BENCH_LOAD_RAW", "1") != "0":
        raw_summary = await _raw_load(ctx, callers, n_sessions, seconds, dockerd)

    extra = {"callers": callers, "sessions": n_sessions, "seconds": seconds, "rate": rate}
    results["load_runs_per_s"] = Metric(
        ours=ours_summary["runs_per_s"],
        raw=raw_summary["runs_per_s"],
        unit="1/s",
        extra={**extra, "ours_detail": ours_summary, "raw_detail": raw_summary},
    )
    results["load_run_p50"] = Metric(
        ours=ours_summary["p50_ms"],
        raw=raw_summary["p50_ms"],
        unit="ms",
        extra={"ours_p99": ours_summary["p99_ms"], "raw_p99": raw_summary["p99_ms"]},
    )
    for role in ("server", "host", "agent", "command", "shim", "dockerd", "client"):
        results[f"load_cpu_{role}_per_run"] = Metric(
            ours=ours_summary["cpu_ms_per_run"][role],
            raw=raw_summary["cpu_ms_per_run"].get(role) if role != "server" else None,
            unit="ms",
        )
    return results
