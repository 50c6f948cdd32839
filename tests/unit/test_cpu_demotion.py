"""A tenant whose command output is busy while another tenant is active weighs the least CPU at
the kernel (admission/shares.py `on_busy`, tenant_cpu.py `demote`), on the fakes: its sandboxes
get DEMOTED_SHARES at once and their share back once it has been calm; a tenant alone, or one
whose output stays under the busy fraction of its share, is never demoted; the setting off
leaves the weights as they were; the server wires the fair shares to the weights."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from fakes import FakeEngine
from sandboxd import tenancy, tenant_cpu
from sandboxd.admission import FairShares, Shares
from sandboxd.admission.shares import BUSY_FRACTION
from sandboxd.config_sections.admission import AdmissionSection
from sandboxd.models import LimitsRequest, Session
from sandboxd.sessions import CreateSessionInput
from sandboxd.tenant_cpu import DEMOTED_CPU_MILLIS, DEMOTED_SHARES, MIN_CPU_MILLIS
from session_stack import Stack, session_stack

T = TypeVar("T")
SHARES = Shares(output_bytes_per_s=8000, output_burst_bytes=800, window_s=1)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


async def _as(tenant: str, call: Callable[[], Awaitable[T]]) -> T:
    async def served() -> T:
        tenancy.use_tenant(tenant, tenancy.TenantGrants())
        return await call()

    return await asyncio.create_task(served())


async def _create(st: Stack, tenant: str, n: int) -> list[Session]:
    return [
        await _as(tenant, lambda i=i: st.sessions.create(CreateSessionInput(f"{tenant}.s{i}")))  # type: ignore[misc]
        for i in range(n)
    ]


def _weights(st: Stack, sessions: list[Session]) -> list[int]:
    return [st.engine.sandboxes[s.container_id].cpu_shares for s in sessions]


def _limits(st: Stack, sessions: list[Session]) -> list[int]:
    """The CPU limit each sandbox was given in place (0: never changed, its own)."""
    return [st.engine.sandboxes[s.container_id].cpu_millis for s in sessions]


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


def test_output_faster_than_the_busy_fraction_marks_the_tenant_busy_only_under_contention() -> None:
    clock = Clock()
    shares = FairShares(SHARES, clock)
    busy: list[str] = []
    shares.on_busy = busy.append
    burst = SHARES.output_burst_bytes * BUSY_FRACTION  # 100 bytes
    # Alone on the server: however fast, never busy (nor paced).
    assert shares.output_delay("flood", 10_000) == 0 and busy == []
    shares.admit_call("calm")  # another tenant is active now
    # Under the busy rate (1000 B/s): a read of 90 bytes every 0.1 s stays within it.
    for _ in range(20):
        clock.now += 0.1
        shares.admit_call("calm")  # the bystander stays active throughout
        shares.output_delay("flood", 90)
    assert busy == []
    # Past it (still far under the share itself: 8000 B/s, nothing is paced): busy.
    for _ in range(5):
        clock.now += 0.1
        shares.admit_call("calm")
        assert shares.output_delay("flood", int(burst * 2)) == 0
    assert busy and set(busy) == {"flood"}
    assert "calm" not in busy  # the bystander moved nothing


async def test_a_busy_tenant_weighs_the_least_until_it_has_been_calm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tenant_cpu, "DEMOTION_S", 0.2)
    async with session_stack(tmp_path) as st:
        calm = await _create(st, "calm", 1)
        flood = await _create(st, "flood", 4)
        cpu = st.sessions.cpu
        assert cpu is not None and _weights(st, flood) == [256] * 4
        own = flood[0].spec.limits.cpu_millis
        assert own > DEMOTED_CPU_MILLIS // 4
        cpu.demote("flood")
        await _until(lambda: _weights(st, flood) == [DEMOTED_SHARES] * 4)
        assert _weights(st, calm) == [1024]  # the other tenant keeps its weight
        # Its sandboxes share DEMOTED_CPU_MILLIS of CPU time, the other tenant keeps its limit.
        assert _limits(st, flood) == [DEMOTED_CPU_MILLIS // 4] * 4
        assert cpu.cpu_limits("flood") == {s.session_id: DEMOTED_CPU_MILLIS // 4 for s in flood}
        assert _limits(st, calm) == [0]  # never changed in place
        updates = st.engine.calls.count("set_cpu_shares")
        for _ in range(50):  # busy on every read: told the engine once, not once a read
            cpu.demote("flood")
        await asyncio.sleep(0.05)
        assert st.engine.calls.count("set_cpu_shares") == updates
        # A session made while its tenant is demoted starts with the least weight too.
        more = await _as("flood", lambda: st.sessions.create(CreateSessionInput("flood.new")))
        assert st.engine.sandboxes[more.container_id].cpu_shares == DEMOTED_SHARES
        await _until(lambda: _limits(st, [*flood, more]) == [DEMOTED_CPU_MILLIS // 5] * 5)
        # Calm for DEMOTION_S: every sandbox of the tenant gets its share back (5 sessions),
        # and its own CPU limit.
        await _until(lambda: _weights(st, [*flood, more]) == [128] * 5)
        assert _limits(st, [*flood, more]) == [own] * 5
        assert not cpu.demoted("flood")


async def test_a_demoted_tenants_cap_never_raises_a_limit_nor_goes_under_the_least(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each sandbox gets min(its own limit, the cap's part), at least MIN_CPU_MILLIS; with the
    cap at 0 the weight alone changes and the limits stay."""
    monkeypatch.setattr(tenant_cpu, "DEMOTION_S", 60)
    async with session_stack(tmp_path) as st:
        await _create(st, "calm", 1)
        small = await _as(
            "flood",
            lambda: st.sessions.create(
                CreateSessionInput("flood.small", limits=LimitsRequest(cpu_millis=50))
            ),
        )
        flood = [small, *await _create(st, "flood", 2)]
        cpu = st.sessions.cpu
        assert cpu is not None
        cpu.demote("flood")
        own = flood[1].spec.limits.cpu_millis
        each = DEMOTED_CPU_MILLIS // 3
        wanted = [50, min(own, each), min(own, each)]
        await _until(lambda: list(cpu.cpu_limits("flood").values()) == wanted)
        assert _limits(st, flood) == [0, *wanted[1:]]  # the small one's is not touched
        await cpu.close()
    section = AdmissionSection(demoted_cpu_millis=20)
    async with session_stack(tmp_path / "b", admission=section) as st:
        await _create(st, "calm", 1)
        flood = await _create(st, "flood", 4)
        assert st.sessions.cpu is not None
        st.sessions.cpu.demote("flood")
        await _until(lambda: _limits(st, flood) == [MIN_CPU_MILLIS] * 4)
    section = AdmissionSection(demoted_cpu_millis=0)
    async with session_stack(tmp_path / "c", admission=section) as st:
        await _create(st, "calm", 1)
        flood = await _create(st, "flood", 2)
        assert st.sessions.cpu is not None
        st.sessions.cpu.demote("flood")
        await _until(lambda: _weights(st, flood) == [DEMOTED_SHARES] * 2)
        assert _limits(st, flood) == [0, 0]


async def test_demotion_off_leaves_the_weights_alone(tmp_path: Path) -> None:
    section = AdmissionSection(cpu_demotion=False)
    async with session_stack(tmp_path, admission=section) as st:
        flood = await _create(st, "flood", 2)
        cpu = st.sessions.cpu
        assert cpu is not None
        cpu.demote("flood")
        await asyncio.sleep(0.05)
        assert _weights(st, flood) == [512, 512] and not cpu.demoted("flood")


async def test_an_unknown_tenant_is_not_demoted_and_close_ends_a_demotion() -> None:
    cpu = tenant_cpu.TenantCpu(FakeEngine())
    cpu.demote("nobody")  # no live sandbox: nothing to weigh, nothing kept
    assert not cpu.demoted("nobody")
    await cpu.close()


def test_the_server_wires_busy_output_to_the_cpu_weights() -> None:
    source = Path(tenant_cpu.__file__).with_name("server").joinpath("parts.py").read_text()
    assert "shares.on_busy = sessions.cpu.demote" in source
