"""`make bench`: every benchmark in one process, ours next to raw aiodocker, round by round.

Starts one real sandboxd server (a subprocess, warm pool and metrics on), opens one gRPC channel
and one long-lived aiodocker client, then runs each `bench/bench_*.py` module's
`async def run(ctx) -> dict[str, Metric]` (see bench/common.py) in file-name order. Absent
modules are simply absent; one that fails is reported and skipped. Results go to
`bench/results.json` and a table on stdout. Targets are reported, never enforced: the exit
status is 0 unless the runner itself could not work.

    .venv/bin/python bench/run.py [--rounds N] [--warmup N] [--only NAME,...] [--output FILE]
                                  [--sessions N]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib
import json
import os
import re
import secrets
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `python bench/run.py` puts only bench/ on the path

import aiodocker  # noqa: E402
import aiohttp  # noqa: E402
import grpc  # noqa: E402
from sandboxd.v1 import (  # noqa: E402
    admin_pb2_grpc,
    filesystem_pb2_grpc,
    process_pb2_grpc,
    session_pb2_grpc,
)

from bench.common import BenchContext, Metric, Stubs  # noqa: E402

IMAGE = os.environ.get("SANDBOXD_BENCH_IMAGE", "sandboxd-runtime:busybox")
# SANDBOXD_BENCH_HELPER: another build of the in-sandbox helper (its volume is named by content),
# to compare two agents back to back with the same server.
HELPER = Path(os.environ.get("SANDBOXD_BENCH_HELPER", "") or REPO / "build" / "sbx")
KEEPER_USER = "65533:65533"
POOL_SIZE = 2
_LISTEN_RE = re.compile(r"sandboxd listening on (\S+):(\d+)")
_METRICS_RE = re.compile(r"metrics served at http://(\S+):(\d+)/metrics")
_E2B_RE = re.compile(r"E2B door on (http://\S+:\d+)")

# name: (kind, target). "max": the ratio ours/raw must be at most target, "min": at least;
# "abs_max": an absolute bound on ours itself, in the metric's unit (raw is shown for context);
# "abs_min": an absolute floor on ours.
# The in-sandbox agent set run_true, the four streaming throughputs, the Interact
# round trip, time_to_interactive and RSS_TARGET_MIB.
TARGETS: dict[str, tuple[str, float]] = {
    "create_session_warm": ("max", 0.25),
    "create_session_cold": ("max", 1.25),
    "run_true": ("max", 0.5),  # the agent aims for 0.2
    "run_true_audit": ("max", 1.05),  # audit on vs the same server with it off
    "time_to_interactive": ("abs_max", 20.0),  # ms: CreateSession (pool hit) + first Run
    "exec_stream_throughput": ("min", 1.0),
    "attach_process_throughput": ("min", 1.0),
    "interact_stdout_throughput": ("min", 1.0),
    "interact_round_trip": ("max", 1.0),
    "secret_upload_throughput": ("min", 0.8),
    # Archives: random bytes (nothing to compress) at least 0.8 of raw tar, plain or zstd; a
    # source tree compressed at or above raw tar of the same tree (bench/archive_mix.py)
    "export_throughput": ("min", 0.8),
    "import_throughput": ("min", 0.8),
    "export_random_zstd_throughput": ("min", 0.8),
    "import_random_zstd_throughput": ("min", 0.8),
    "export_tree_zstd_throughput": ("min", 1.0),
    "import_tree_zstd_throughput": ("min", 1.0),
    "preview_download_throughput": ("min", 1.0),
    # bench_load: CPU per Run(["true"]) under load is the primary figure (robust to a shared
    # machine); Runs/s is reported with the machine's load beside it
    "load_cpu_server_per_run": ("abs_max", 0.8),
    "load_cpu_host_per_run": ("abs_max", 2.0),
    "load_runs_per_s": ("abs_min", 1000.0),
}
RSS_TARGET_MIB = 150.0  # the server's RSS after the full bench
IDLE_RSS_TARGET_MIB = 80.0  # after start-up, pool full (the earlier target)


class Server:
    """The sandboxd subprocess under test; its output is drained so it never blocks."""

    def __init__(self, proc: asyncio.subprocess.Process, owner: str, data_dir: Path) -> None:
        self.proc = proc
        self.owner = owner
        self.data_dir = data_dir
        self.port = 0
        self.metrics_port = 0
        self.e2b_url = ""
        # The last lines, for an error: a deque, since the load scenario logs a line per call.
        self.lines: collections.deque[str] = collections.deque(maxlen=500)
        self._ready = asyncio.Event()
        self._drain = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            self.lines.append(line)
            if self._ready.is_set():
                continue  # the ports are printed before "listening": nothing more to find
            if m := _METRICS_RE.search(line):
                self.metrics_port = int(m.group(2))
            if m := _E2B_RE.search(line):
                self.e2b_url = m.group(1)
            if m := _LISTEN_RE.search(line):
                self.port = int(m.group(2))
                self._ready.set()
        self._ready.set()

    async def wait_ready(self) -> None:
        await asyncio.wait_for(self._ready.wait(), timeout=60)
        if not self.port:
            raise RuntimeError("sandboxd did not start:\n" + "".join(list(self.lines)[-50:]))

    def rss_mib(self, key: str = "VmRSS") -> float:
        """VmRSS now (or VmHWM: the peak since start, or since bench_archive reset it)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        kib = int(re.search(rf"{key}:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
        return kib / 1024

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        with contextlib.suppress(asyncio.CancelledError):
            await self._drain


@contextlib.asynccontextmanager
async def running_server(data_dir: Path, *flags: str) -> AsyncIterator[Server]:
    owner = "bench" + secrets.token_hex(4)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sandboxd",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--data-dir",
        str(data_dir),
        "--owner-id",
        owner,
        "--helper",
        str(HELPER),
        "--image",
        IMAGE,
        "--keeper-user",
        KEEPER_USER,
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "SANDBOXD_LOG_LEVEL": "INFO", "SANDBOXD_LOG_FORMAT": "json"},
    )
    server = Server(proc, owner, data_dir)
    try:
        await server.wait_ready()
        yield server
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def _docker() -> AsyncIterator[aiodocker.Docker]:
    """One long-lived client whose pool fits many open exec streams, like the server's."""
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://"):
        async with aiodocker.Docker(url=host) as docker:
            yield docker
        return
    connector = aiohttp.UnixConnector(host[len("unix://") :], limit=1024)
    try:
        async with aiodocker.Docker(url="unix://localhost", connector=connector) as docker:
            yield docker  # "unix://localhost": a dummy host, the connector has the path
    finally:
        await connector.close()  # aiodocker leaves a caller's connector open


async def _remove_raw(docker: aiodocker.Docker, raw_owner: str) -> None:
    """Whatever a failed module left behind on the raw side."""
    found = await docker.containers.list(
        all=True, filters={"label": [f"io.sandboxd.owner={raw_owner}"]}
    )
    for c in found:
        with contextlib.suppress(aiodocker.DockerError):
            await c.delete(force=True, v=True)


def discover(only: set[str] | None) -> list[str]:
    names = sorted(p.stem for p in (REPO / "bench").glob("bench_*.py"))
    # The core comparison first: its numbers are the ones the targets are about.
    names.sort(key=lambda n: (n != "bench_core", n))
    return [n for n in names if only is None or n in only or n.removeprefix("bench_") in only]


async def main_async(args: argparse.Namespace) -> int:
    only = set(args.only.split(",")) if args.only else None
    modules = discover(only)
    results: dict[str, Any] = {"metrics": {}, "modules": {}}
    raw_owner = "benchraw" + secrets.token_hex(4)
    with tempfile.TemporaryDirectory(prefix="sandboxd-bench-") as tmp:
        async with (
            running_server(
                Path(tmp), "--pool-size", str(POOL_SIZE), "--e2b-listen", "127.0.0.1:0"
            ) as server,
            _docker() as docker,
        ):
            channel = grpc.aio.insecure_channel(
                f"127.0.0.1:{server.port}",
                options=[
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                    ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ],
            )
            ctx = BenchContext(
                address=f"127.0.0.1:{server.port}",
                channel=channel,
                stubs=Stubs(
                    sessions=session_pb2_grpc.SessionServiceStub(channel),
                    processes=process_pb2_grpc.ProcessServiceStub(channel),
                    files=filesystem_pb2_grpc.FilesystemServiceStub(channel),
                    admin=admin_pb2_grpc.AdminServiceStub(channel),
                ),
                docker=docker,
                image=IMAGE,
                helper=HELPER,
                keeper_user=KEEPER_USER,
                raw_owner=raw_owner,
                rounds=args.rounds,
                warmup=args.warmup,
                metrics_url=f"http://127.0.0.1:{server.metrics_port}/metrics",
                pool_size=POOL_SIZE,
                server_pid=server.proc.pid,
                data_dir=server.data_dir,
                sessions=args.sessions,
                e2b_url=server.e2b_url,
            )
            try:
                await ctx.pool_ready()
                await asyncio.sleep(1)  # let start-up work settle before measuring idle
                idle_rss = server.rss_mib()
                for name in modules:
                    results["modules"][name] = await run_module(name, ctx, results["metrics"])
                await asyncio.sleep(1)
                results["server_idle_rss"] = {
                    "mib": round(idle_rss, 1),
                    "after_bench_mib": round(server.rss_mib(), 1),
                    "peak_mib": round(server.rss_mib("VmHWM"), 1),
                    "full_bench": only is None,
                }
            finally:
                await channel.close()
                await _remove_raw(docker, raw_owner)
    results["server_owner"] = server.owner
    results["raw_owner"] = raw_owner
    results["rounds"] = args.rounds
    results["warmup"] = args.warmup
    results["cpus"] = os.cpu_count()
    results["targets"] = {}
    for name, m in results["metrics"].items():
        text, met = verdict(name, m)
        if text:
            results["targets"][name] = {"target": text, "met": met}
    if "server_idle_rss" in results:
        for name, _, target, met in rss_verdicts(results["server_idle_rss"]):
            results["targets"][name] = {"target": f"< {target:g} MiB", "met": met}
    Path(args.output).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print_table(results)
    print(f"\nwritten to {args.output}")
    return 0


async def run_module(name: str, ctx: BenchContext, into: dict[str, Any]) -> str:
    try:
        module = importlib.import_module(f"bench.{name}")
    except Exception as exc:
        print(f"[{name}] skipped: cannot import ({type(exc).__name__}: {exc})", file=sys.stderr)
        return f"import failed: {exc}"
    run = getattr(module, "run", None)
    if run is None:
        print(f"[{name}] skipped: no `async def run(ctx)`", file=sys.stderr)
        return "no run()"
    print(f"[{name}] running ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        metrics: dict[str, Metric] = await run(ctx)
    except Exception:
        print(f"[{name}] failed:\n{traceback.format_exc()}", file=sys.stderr)
        return "failed"
    for metric_name, metric in metrics.items():
        if metric_name in into:
            print(f"[{name}] {metric_name} already measured; ignored", file=sys.stderr)
            continue
        into[metric_name] = {**metric.to_json(), "module": name}
    print(f"[{name}] done in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return "ok"


def verdict(name: str, metric: dict[str, Any]) -> tuple[str, bool | None]:
    """The target's text and whether the metric meets it (None: no target, or nothing to judge)."""
    target = TARGETS.get(name)
    if target is None:
        return "", None
    kind, value = target
    if kind == "abs_max":
        return f"ours <= {value:g} {metric['unit']}", metric["ours"] <= value
    if kind == "abs_min":
        return f"ours >= {value:g} {metric['unit']}", metric["ours"] >= value
    ratio = metric.get("ratio")
    text = f"{'<=' if kind == 'max' else '>='} {value:g}"
    if ratio is None:
        return text, None
    return text, ratio <= value if kind == "max" else ratio >= value


def rss_verdicts(rss: dict[str, Any]) -> list[tuple[str, float, float, bool]]:
    """(row, MiB, target, met) for the server's RSS at start-up and after the bench."""
    rows = [("server_idle_rss", rss["mib"], IDLE_RSS_TARGET_MIB)]
    if "after_bench_mib" in rss:
        rows.append(("server_rss_after_bench", rss["after_bench_mib"], RSS_TARGET_MIB))
    return [(name, mib, target, mib < target) for name, mib, target in rows]


def print_table(results: dict[str, Any]) -> None:
    print(f"\n{'metric':<28}{'ours':>10}{'raw':>10}{'unit':>7}{'ratio':>8}  target")
    for name, m in sorted(results["metrics"].items()):
        text, met = verdict(name, m)
        if met is not None:
            text += "  ok" if met else "  MISSED"
        raw = "-" if m.get("raw") is None else f"{m['raw']:.2f}"
        ratio = m.get("ratio")
        ratio_text = "-" if ratio is None else f"{ratio:.2f}"
        print(f"{name:<28}{m['ours']:>10.2f}{raw:>10}{m['unit']:>7}{ratio_text:>8}  {text}")
    rss = results.get("server_idle_rss")
    if rss:
        for name, mib, target, met in rss_verdicts(rss):
            print(
                f"{name:<28}{mib:>10.1f}{'':>10}{'MiB':>7}{'':>8}"
                f"  < {target:g}  {'ok' if met else 'MISSED'}"
            )
        if "peak_mib" in rss:
            print(f"{'server_rss_peak':<28}{rss['peak_mib']:>10.1f}{'':>10}{'MiB':>7}")
        if not rss.get("full_bench", True):
            print("(server_rss_after_bench: after the selected modules only, not the full bench)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="measured rounds per metric")
    parser.add_argument("--warmup", type=int, default=3, help="discarded rounds first")
    parser.add_argument("--only", default="", help="modules to run, e.g. core,archive")
    parser.add_argument("--output", default=str(REPO / "bench" / "results.json"))
    parser.add_argument(
        "--sessions",
        type=int,
        default=20,
        help="live sessions bench_sessions grows to (1000: about 15 minutes on 2 cores)",
    )
    args = parser.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
