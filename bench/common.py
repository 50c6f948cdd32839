"""What every benchmark module codes against: `BenchContext`, `Metric`, and the sampling helpers.

A benchmark module is any `bench/bench_*.py` that defines

    async def run(ctx: BenchContext) -> dict[str, Metric]

`bench/run.py` imports each one it finds (sorted by file name; a module that is absent, fails to
import or raises is reported and skipped, its metrics are simply missing), calls `run` with one
shared context, and writes every metric to `bench/results.json` as
`{"ours": x, "raw": y, "ratio": x / y, "unit": ...}`. A name that an earlier module already
produced is ignored with a warning: pick your own names (`bench_core.py` owns
`create_session_cold`, `create_session_warm`, `time_to_interactive`, `run_true` and
`exec_stream_throughput`).

Fairness rules for a module:
- compare against the same operation done directly with `ctx.docker` (one long-lived aiodocker
  client, like the server's) on a container with the same profile (`ctx.raw_container()`);
- sample ours and raw in the same rounds with `interleave` (it alternates who goes first and
  discards warm-up rounds); report latency as p50 ms (`latency_metric`, p95 kept as an extra)
  and throughput as median MB/s (`throughput_metric`);
- clean up everything you create (sessions and containers) even when you fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiodocker
import aiohttp
import grpc
from sandboxd.config import DEFAULT_LIMITS
from sandboxd.engine.docker_profile import container_config
from sandboxd.engine.helper_volume import HelperVolume
from sandboxd.engine.protocol import SandboxRequest
from sandboxd.models import NetworkPolicy, SessionSpec, ShellPolicy, WorkspaceManifest
from sandboxd.profile import HELPER_IN_CONTAINER
from sandboxd.v1 import (
    admin_pb2_grpc,
    common_pb2,
    filesystem_pb2_grpc,
    process_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)

MB = 1_000_000  # throughput is reported in decimal megabytes per second


@dataclass
class Metric:
    """One comparison. `ours` and `raw` in `unit`; lower is better for latency, higher for MB/s."""

    ours: float
    raw: float | None
    unit: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.raw is None or self.raw == 0:
            return None
        return self.ours / self.raw

    def to_json(self) -> dict[str, Any]:
        return {
            "ours": round(self.ours, 3),
            "raw": None if self.raw is None else round(self.raw, 3),
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "unit": self.unit,
            **self.extra,
        }


@dataclass
class Stubs:
    sessions: session_pb2_grpc.SessionServiceStub
    processes: process_pb2_grpc.ProcessServiceStub
    files: filesystem_pb2_grpc.FilesystemServiceStub
    admin: admin_pb2_grpc.AdminServiceStub


@dataclass
class BenchContext:
    """Shared by every module in one `make bench` run: one server, one Docker client."""

    address: str  # the sandboxd server under test, host:port
    channel: grpc.aio.Channel
    stubs: Stubs
    docker: aiodocker.Docker
    image: str
    helper: Path
    keeper_user: str
    raw_owner: str  # label value of raw-side containers (never the server's owner id)
    rounds: int = 30
    warmup: int = 3
    metrics_url: str = ""  # the server's Prometheus endpoint
    pool_size: int = 0  # the server's warm pool size
    server_pid: int = 0  # the server process (for RSS or profiling)
    data_dir: Path = Path()  # the server's data directory (read-only for modules)
    sessions: int = 20  # live sessions bench_sessions grows to (`--sessions`)
    e2b_url: str = ""  # the server's E2B door (bench_e2b)
    _helper_volume: HelperVolume | None = None  # ensure_helper_volume's, checked once

    async def scrape(self) -> str:
        """The server's metrics page, as text."""
        async with aiohttp.ClientSession() as http, http.get(self.metrics_url) as resp:
            return await resp.text()

    async def pool_ready(self, timeout: float = 60) -> None:
        """Wait until the warm pool is full again, so its refill overlaps no measurement."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(r"^sandboxd_pool_available (\S+)$", await self.scrape(), re.M)
            if m and float(m.group(1)) >= self.pool_size:
                return
            await asyncio.sleep(0.02)
        raise RuntimeError("the warm pool did not fill")

    def raw_config(self, name: str, spec: SessionSpec | None = None) -> dict[str, Any]:
        """The server's own create request for a default session (or `spec`)."""
        spec = spec or default_spec(self.image)
        request = SandboxRequest(
            spec=spec,
            owner_id=self.raw_owner,
            name=name,
            session_id=name,
            fingerprint=spec.fingerprint(),
        )
        return container_config(
            request, helper_volume=HelperVolume(self.helper).name, keeper_user=self.keeper_user
        )

    async def ensure_helper_volume(self) -> None:
        """The helper volume the server's sandboxes mount (made by the server too; idempotent).

        One HelperVolume for the run, as the server keeps one: a new one each time checks the
        volume's content again (a filler container created, read and removed), and a raw
        create+start timed with that in it would seem to cost twice what the engine's does."""
        if self._helper_volume is None:
            self._helper_volume = HelperVolume(self.helper)
        await self._helper_volume.ensure(self.docker, self.image)

    async def raw_create_start(self, spec: SessionSpec | None = None) -> str:
        """Create and start a container exactly as the server would; returns its id."""
        name = "raw-" + secrets.token_hex(6)
        await self.ensure_helper_volume()
        container = await self.docker.containers.create(
            self.raw_config(name, spec), name=f"sandboxd-bench-{name}"
        )
        await container.start()
        return str(container.id)

    async def raw_remove(self, container_id: str) -> None:
        with contextlib.suppress(aiodocker.DockerError):
            await self.docker.containers.container(container_id).delete(force=True, v=True)

    @contextlib.asynccontextmanager
    async def raw_container(self, spec: SessionSpec | None = None) -> AsyncIterator[str]:
        """A started raw container with the session profile, removed afterwards."""
        cid = await self.raw_create_start(spec)
        try:
            yield cid
        finally:
            await self.raw_remove(cid)

    async def raw_exec(
        self, container_id: str, argv: Sequence[str], *, user: str = "65534:65534"
    ) -> tuple[int, int]:
        """Exec `argv` directly, drain its output, read the exit code: (exit code, bytes out)."""
        container = self.docker.containers.container(container_id)
        execution = await container.exec(list(argv), user=user, stdin=False)
        received = 0
        async with execution.start(detach=False) as stream:
            while (msg := await stream.read_out()) is not None:
                received += len(msg.data)
        for delay in (0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1):
            if delay:
                await asyncio.sleep(delay)
            info = await execution.inspect()
            if not info.get("Running"):
                return int(info.get("ExitCode") or 0), received
        return -1, received

    @contextlib.asynccontextmanager
    async def session(self, **fields: Any) -> AsyncIterator[session_pb2.Session]:
        """A session created over gRPC (every command allowed unless `shell` is given)."""
        fields.setdefault("shell", common_pb2.ShellPolicy(allow_all=True))
        resp = await self.stubs.sessions.CreateSession(session_pb2.CreateSessionRequest(**fields))
        try:
            if self.pool_size and self.metrics_url:
                # A pool hit starts a refill (a create+start, 0.25 s after the claim): let it
                # finish before the caller measures anything in the session.
                await self.pool_ready()
            yield resp.session
        finally:
            await self.delete_session(resp.session.session_id)

    async def delete_session(self, session_id: str) -> None:
        with contextlib.suppress(grpc.RpcError):
            await self.stubs.sessions.DeleteSession(
                session_pb2.DeleteSessionRequest(session_id=session_id)
            )


def default_spec(image: str) -> SessionSpec:
    """The spec of a session created with nothing set (the server's default limits)."""
    return SessionSpec(
        image=image,
        limits=DEFAULT_LIMITS,
        shell=ShellPolicy(allow_all=True),
        network=NetworkPolicy(),
        env={},
        uid=65534,
        gid=65534,
        manifest=WorkspaceManifest(),
    )


Sample = Callable[[], Awaitable[float]]


async def interleave(
    ctx: BenchContext, ours: Sample, raw: Sample
) -> tuple[list[float], list[float]]:
    """Sample both sides round by round; who goes first alternates; warm-up rounds discarded."""
    ours_samples: list[float] = []
    raw_samples: list[float] = []
    for i in range(ctx.warmup + ctx.rounds):
        first, second = (ours, raw) if i % 2 == 0 else (raw, ours)
        a = await first()
        b = await second()
        o, r = (a, b) if i % 2 == 0 else (b, a)
        if i >= ctx.warmup:
            ours_samples.append(o)
            raw_samples.append(r)
    return ours_samples, raw_samples


async def timed_ms(fn: Callable[[], Awaitable[object]]) -> float:
    """Milliseconds `fn` takes."""
    start = time.perf_counter()
    await fn()
    return (time.perf_counter() - start) * 1000


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of the samples."""
    ordered = sorted(samples)
    index = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def latency_metric(ours: Sequence[float], raw: Sequence[float] | None) -> Metric:
    """p50 milliseconds; p95 and the sample count ride along as extras."""
    extra: dict[str, Any] = {
        "ours_p95": round(percentile(ours, 95), 3),
        "samples": len(ours),
    }
    if raw:
        extra["raw_p95"] = round(percentile(raw, 95), 3)
    return Metric(
        ours=statistics.median(ours),
        raw=statistics.median(raw) if raw else None,
        unit="ms",
        extra=extra,
    )


def throughput_metric(ours: Sequence[float], raw: Sequence[float] | None) -> Metric:
    """Median MB/s of samples already in MB/s."""
    return Metric(
        ours=statistics.median(ours),
        raw=statistics.median(raw) if raw else None,
        unit="MB/s",
        extra={"samples": len(ours)},
    )


def mb_per_s(nbytes: int, seconds: float) -> float:
    return nbytes / MB / seconds if seconds > 0 else 0.0


__all__ = [
    "HELPER_IN_CONTAINER",
    "MB",
    "BenchContext",
    "Metric",
    "Sample",
    "Stubs",
    "default_spec",
    "interleave",
    "latency_metric",
    "mb_per_s",
    "percentile",
    "throughput_metric",
    "timed_ms",
]
