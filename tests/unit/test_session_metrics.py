"""Per-session gauges: one series per sampled session and metric, at most metrics_session_limit
sessions (the oldest), the rest counted; series of sessions no longer sampled disappear."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from sandboxd.engine.protocol import SandboxStats
from sandboxd.errors import NotFound
from sandboxd.models import SessionState
from sandboxd.session_metrics import SessionGauges, SessionSampler

T0 = datetime(2026, 12, 1, tzinfo=UTC)


class DfStream:
    def __init__(self, used_kib: int) -> None:
        out = (
            "Filesystem 1024-blocks Used Available Capacity Mounted on\n"
            f"tmpfs 65536 {used_kib} 1 1% /workspace\n"
        )
        self._chunks = [(1, out.encode())]

    async def read(self) -> tuple[int, bytes] | None:
        return self._chunks.pop(0) if self._chunks else None


@dataclass
class Engine:
    """sandbox_stats and the workspace's `df`, per container (an independent stand-in)."""

    stats: dict[str, SandboxStats] = field(default_factory=dict)
    used_kib: dict[str, int] = field(default_factory=dict)

    async def sandbox_stats(self, container_id: str) -> SandboxStats:
        if container_id not in self.stats:
            raise NotFound(f"no sandbox {container_id}")
        return self.stats[container_id]

    @contextlib.asynccontextmanager
    async def open(self, where: Any, command: Any) -> AsyncIterator[DfStream]:
        """The sandbox commands' side of the stand-in: the workspace's `df`."""
        assert command.argv[:1] == ("df",)
        yield DfStream(self.used_kib.get(where.container_id, 0))


@dataclass
class Store:
    sessions: list[Any]

    async def all(self) -> list[Any]:
        return self.sessions


def _session(n: int, state: SessionState = SessionState.RUNNING) -> Any:
    return SimpleNamespace(
        session_id=f"s{n}",
        tenant="alpha" if n % 2 else "beta",
        state=state,
        container_id=f"c{n}",
        created_at=T0 + timedelta(minutes=n),
        spec=SimpleNamespace(user="1000:1000"),
    )


def _series(registry: CollectorRegistry, name: str) -> dict[str, float]:
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('session="')[1].split('"')[0]] = float(value)
    return out


def _value(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    assert value is not None
    return value


async def test_the_oldest_sessions_up_to_the_limit_get_series() -> None:
    engine = Engine()
    sessions = [_session(n) for n in (3, 1, 2)]
    for n in (1, 2, 3):
        engine.stats[f"c{n}"] = SandboxStats(
            cpu_seconds=n * 1.5, memory_bytes=n << 20, network_bytes=10 * n
        )
        engine.used_kib[f"c{n}"] = 4 * n
    registry = CollectorRegistry()
    gauges = SessionGauges(registry)
    sampler = SessionSampler(
        Store(sessions),
        engine,
        gauges,
        limit=2,
        egress_bytes=lambda sid: 1000,  # type: ignore[arg-type]
        commands=engine,  # type: ignore[arg-type]
    )
    await sampler.sample()
    assert _series(registry, "sandboxd_session_cpu_seconds") == {"s1": 1.5, "s2": 3.0}
    assert _series(registry, "sandboxd_session_memory_bytes") == {"s1": 1 << 20, "s2": 2 << 20}
    assert _series(registry, "sandboxd_session_workspace_bytes") == {"s1": 4096, "s2": 8192}
    assert _series(registry, "sandboxd_session_egress_bytes") == {"s1": 1010, "s2": 1020}
    assert _value(registry, "sandboxd_session_series_omitted") == 1
    assert (
        registry.get_sample_value(
            "sandboxd_session_cpu_seconds", {"tenant": "alpha", "session": "s1"}
        )
        == 1.5
    )

    # s1 ends: its series go, and s3 takes the freed place
    sessions[1].state = SessionState.EXPIRED
    await sampler.sample()
    for name in ("cpu_seconds", "memory_bytes", "workspace_bytes", "egress_bytes"):
        assert set(_series(registry, f"sandboxd_session_{name}")) == {"s2", "s3"}, name
    assert _value(registry, "sandboxd_session_series_omitted") == 0


async def test_series_stay_bounded_however_many_sessions_run() -> None:
    engine = Engine()
    sessions = [_session(n) for n in range(500)]
    for n in range(500):
        engine.stats[f"c{n}"] = SandboxStats(cpu_seconds=1.0)
    registry = CollectorRegistry()
    sampler = SessionSampler(
        Store(sessions), engine, SessionGauges(registry), limit=10, commands=engine
    )  # type: ignore[arg-type]
    await sampler.sample()
    assert set(_series(registry, "sandboxd_session_cpu_seconds")) == {f"s{n}" for n in range(10)}
    assert _value(registry, "sandboxd_session_series_omitted") == 490


async def test_a_session_whose_container_is_gone_has_no_series() -> None:
    engine = Engine(stats={"c1": SandboxStats(cpu_seconds=2.0)})
    sessions = [_session(1), _session(2), _session(3, SessionState.SUSPENDED)]
    registry = CollectorRegistry()
    sampler = SessionSampler(
        Store(sessions), engine, SessionGauges(registry), limit=10, commands=engine
    )  # type: ignore[arg-type]
    await sampler.sample()
    assert _series(registry, "sandboxd_session_cpu_seconds") == {"s1": 2.0}
    assert _value(registry, "sandboxd_session_series_omitted") == 0
