"""Each tenant's sandboxes share one CPU weight (tenant_cpu.py), on the engine fake: a tenant
with four sessions weighs what a tenant with one does, however they were made (cold, warm,
gVisor) and whatever ended them (delete, loss, a restart of the server); the setting off
leaves every sandbox the engine's default."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from fakes import FakeEngine
from sandboxd import tenancy
from sandboxd.config_sections.admission import AdmissionSection
from sandboxd.errors import SandboxError
from sandboxd.isolation import Isolation, IsolationTiers
from sandboxd.models import ManifestFile, Session, WorkspaceManifest
from sandboxd.sessions import CreateSessionInput
from sandboxd.tenant_cpu import TENANT_SHARES, share_of
from session_stack import Stack, session_stack

T = TypeVar("T")


async def _as(tenant: str, call: Callable[[], Awaitable[T]]) -> T:
    """`call` served as an authenticated call of `tenant` (each RPC is a task of its own)."""

    async def served() -> T:
        tenancy.use_tenant(tenant, tenancy.TenantGrants())
        return await call()

    return await asyncio.create_task(served())


async def _create(st: Stack, tenant: str, n: int, **kw: object) -> list[Session]:
    made = []
    for i in range(n):
        sid = f"{tenant}.s{i}"
        made.append(
            await _as(tenant, lambda sid=sid: st.sessions.create(CreateSessionInput(sid, **kw)))  # type: ignore[misc]
        )
    return made


def _weights(st: Stack, sessions: list[Session]) -> list[int]:
    return [st.engine.sandboxes[s.container_id].cpu_shares for s in sessions]


def test_a_tenants_share_is_split_in_powers_of_two_and_never_below_the_kernels_least() -> None:
    assert [share_of(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1024, 512, 256, 256, 128, 128, 64]
    assert share_of(10_000) == 2
    for n in range(1, 600):  # a tenant's total: between half of one default cgroup and one
        assert TENANT_SHARES // 2 <= n * share_of(n) <= TENANT_SHARES or share_of(n) == 2


async def test_four_sessions_of_one_tenant_weigh_what_one_session_of_another_does(
    tmp_path: Path,
) -> None:
    async with session_stack(tmp_path) as st:
        calm = await _create(st, "calm", 1)
        flood = await _create(st, "flood", 4)
        assert _weights(st, calm) == [1024]
        assert _weights(st, flood) == [256] * 4
        assert sum(_weights(st, flood)) == sum(_weights(st, calm))
        # The bookkeeping says the same as the engine.
        cpu = st.sessions.cpu
        assert cpu is not None and set(cpu.shares("flood").values()) == {256}
        # Updates only where the count crossed a power of two: 1->2, 2->3 (the fourth was made
        # with its share and the others had it already).
        assert st.engine.calls.count("set_cpu_shares") == 1 + 2
        # Deleted down to one: the last one weighs a whole tenant again.
        for s in flood[1:]:
            await _as("flood", lambda s=s: st.sessions.delete(s.session_id))  # type: ignore[misc]
        assert _weights(st, flood[:1]) == [1024] and _weights(st, calm) == [1024]
        assert cpu.shares("flood") == {flood[0].session_id: 1024}


async def test_a_warm_sandbox_takes_its_tenants_share_when_claimed(tmp_path: Path) -> None:
    async with session_stack(tmp_path, pool_size=1) as st:
        cold = await _create(st, "flood", 3)  # before the pool is filled: made cold
        assert st.pool is not None
        st.pool.start()
        for _ in range(300):
            if st.pool.available >= 1:
                break
            await asyncio.sleep(0.01)
        (member,) = set(st.engine.sandboxes) - {s.container_id for s in cold}
        assert st.engine.sandboxes[member].cpu_shares == 1024  # made before its tenant was known
        warm = await _as("flood", lambda: st.sessions.create(CreateSessionInput("flood.w")))
        assert warm.container_id == member
        assert _weights(st, [*cold, warm]) == [256] * 4


async def test_a_lost_sandbox_leaves_its_tenants_share(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        flood = await _create(st, "flood", 2)
        assert _weights(st, flood) == [512, 512]
        st.engine.lose(flood[1].container_id)
        await st.sessions.reconcile()
        assert _weights(st, flood[:1]) == [1024]


async def test_a_create_that_fails_after_its_sandbox_started_leaves_no_weight_behind(
    tmp_path: Path,
) -> None:
    async with session_stack(tmp_path) as st:
        flood = await _create(st, "flood", 1)
        st.engine.fail("exec")  # the manifest's write, after the sandbox is provisioned
        manifest = WorkspaceManifest(files=(ManifestFile("a.txt", b"a", 0o644),))
        with pytest.raises(SandboxError):
            await _as(
                "flood",
                lambda: st.sessions.create(CreateSessionInput("flood.x", manifest=manifest)),
            )
        cpu = st.sessions.cpu
        assert cpu is not None and cpu.shares("flood") == {flood[0].session_id: 1024}
        assert _weights(st, flood) == [1024]


async def test_a_restarted_server_gives_the_live_sessions_their_share_again(
    tmp_path: Path,
) -> None:
    engine = FakeEngine()
    async with session_stack(tmp_path, engine=engine) as st:
        flood = await _create(st, "flood", 2)
    for s in flood:  # as an engine that lost the update, or a server without the setting
        engine.sandboxes[s.container_id].cpu_shares = 1024
    async with session_stack(tmp_path, engine=engine) as st:
        await st.sessions.reconcile()
        assert _weights(st, flood) == [512, 512]
        more = await _create(st, "flood", 3)  # s0..s2: s2 is new
        assert _weights(st, flood + more[2:]) == [256] * 3


async def _both_tiers(*, gvisor_cpu: bool) -> tuple[FakeEngine, IsolationTiers]:
    """A fake engine with runsc registered (`gvisor_cpu`: a gVisor sandbox's CPU can change)."""
    engine = FakeEngine()
    engine.tiers.add(Isolation.GVISOR)
    engine.gvisor_cpu = gvisor_cpu
    tiers = IsolationTiers(Isolation.RUNC, {Isolation.RUNC, Isolation.GVISOR})
    await tiers.refresh(engine)
    return engine, tiers


async def test_a_gvisor_sandbox_keeps_the_share_it_was_made_with(tmp_path: Path) -> None:
    engine, tiers = await _both_tiers(gvisor_cpu=False)
    async with session_stack(tmp_path, engine=engine, tiers=tiers) as st:
        g = await _create(st, "flood", 1, isolation=Isolation.GVISOR)
        runc = await _as("flood", lambda: st.sessions.create(CreateSessionInput("flood.r1")))
        # runsc cannot change it in place: never asked to (the fake refuses as Docker does).
        assert _weights(st, g) == [1024] and _weights(st, [runc]) == [512]
        g2 = await _as(
            "flood",
            lambda: st.sessions.create(CreateSessionInput("flood.g2", isolation=Isolation.GVISOR)),
        )
        assert _weights(st, [g2]) == [256] and _weights(st, [runc]) == [256]


async def test_a_gvisor_sandbox_follows_its_tenant_where_the_engine_can_change_it(
    tmp_path: Path,
) -> None:
    """Beside a local Docker engine a gVisor sandbox's host cgroup is written (`cpu_in_place`):
    it follows its tenant's count like a runc one, and a demotion weighs and caps it too."""
    engine, tiers = await _both_tiers(gvisor_cpu=True)
    async with session_stack(tmp_path, engine=engine, tiers=tiers) as st:
        g = await _create(st, "flood", 1, isolation=Isolation.GVISOR)
        runc = await _as("flood", lambda: st.sessions.create(CreateSessionInput("flood.r1")))
        assert _weights(st, g) == [512] and _weights(st, [runc]) == [512]
        await _create(st, "calm", 1)
        assert st.sessions.cpu is not None
        st.sessions.cpu.demote("flood")
        for _ in range(200):
            if _weights(st, [*g, runc]) == [2, 2]:
                break
            await asyncio.sleep(0.01)
        assert _weights(st, [*g, runc]) == [2, 2]
        assert [st.engine.sandboxes[s.container_id].cpu_millis for s in (*g, runc)] == [250, 250]
        await st.sessions.cpu.close()


async def test_the_setting_off_leaves_every_sandbox_the_engines_default(tmp_path: Path) -> None:
    async with session_stack(tmp_path, admission=AdmissionSection(tenant_cpu=False)) as st:
        flood = await _create(st, "flood", 4)
        assert st.sessions.cpu is None
        assert _weights(st, flood) == [1024] * 4
        assert "set_cpu_shares" not in st.engine.calls
