"""The warm pool and tenant quotas with the session domain, on the engine fake. No Docker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fakes import FakeEngine
from sandboxd.config import Config
from sandboxd.errors import ResourceExhausted
from sandboxd.host_ids import HostIds
from sandboxd.models import LimitsRequest
from sandboxd.pool import WarmPool, pool_template
from sandboxd.sessions import CreateSessionInput
from session_stack import as_tenant, session_stack

MiB = 1024 * 1024


async def _filled(pool: object, n: int) -> None:
    for _ in range(500):
        if pool.available >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the pool did not fill")


async def test_default_sessions_take_a_warm_sandbox(tmp_path: Path) -> None:
    async with session_stack(tmp_path, pool_size=1) as st:
        assert st.pool is not None
        st.pool.start()
        await _filled(st.pool, 1)
        warm = next(iter(st.engine.sandboxes))
        s = await st.sessions.create(CreateSessionInput(session_id="w"))
        assert s.container_id == warm
        await _filled(st.pool, 1)  # refilled in the background
        assert len(st.engine.sandboxes) == 2
        # Reconcile leaves pool members and claimed ones alone.
        await st.sessions.reconcile()
        assert len(st.engine.sandboxes) == 2
        # Another shape is created cold.
        other = await st.sessions.create(
            CreateSessionInput(session_id="big", limits=LimitsRequest(memory_bytes=300 * MiB))
        )
        assert other.container_id != warm and st.pool.available == 1
        await st.sessions.delete("w")
        assert warm not in st.engine.sandboxes
        await st.pool.close()
        assert set(st.engine.sandboxes) == {other.container_id}


async def test_a_warm_sandbox_gone_behind_our_back_is_never_handed_out(tmp_path: Path) -> None:
    async with session_stack(tmp_path, pool_size=1) as st:
        assert st.pool is not None
        st.pool.start()
        await _filled(st.pool, 1)
        st.engine.lose(next(iter(st.engine.sandboxes)))
        s = await st.sessions.create(CreateSessionInput(session_id="cold"))
        assert st.engine.sandboxes[s.container_id].running


async def test_tenant_session_quota(tmp_path: Path) -> None:
    async with session_stack(tmp_path, tenant_max_sessions=2) as st:
        for sid in ("acme.q1", "acme.q2"):
            create = CreateSessionInput(session_id=sid)
            await as_tenant("acme", lambda c=create: st.sessions.create(c))  # type: ignore[misc]
        with pytest.raises(ResourceExhausted) as exc:
            await as_tenant("acme", lambda: st.sessions.create(CreateSessionInput()))
        assert exc.value.reason == "TENANT_SESSION_QUOTA"
        # Another tenant has its own quota; an ended session frees a place.
        await as_tenant("other", lambda: st.sessions.create(CreateSessionInput()))
        await as_tenant("acme", lambda: st.sessions.delete("acme.q1"))
        await as_tenant("acme", lambda: st.sessions.create(CreateSessionInput()))


async def test_tenant_memory_quota_counts_concurrent_creates(tmp_path: Path) -> None:
    async with session_stack(tmp_path, tenant_max_memory_bytes=300 * MiB) as st:

        def create() -> object:
            limits = LimitsRequest(memory_bytes=128 * MiB)
            return st.sessions.create(CreateSessionInput(limits=limits))

        results = await asyncio.gather(
            *(as_tenant("acme", create) for _ in range(4)),  # type: ignore[arg-type]
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, ResourceExhausted)]
        assert len(refused) == 2 and all(r.reason == "TENANT_MEMORY_QUOTA" for r in refused)
        assert len(st.engine.sandboxes) == 2


class _NoRecords:
    """A store without sessions: only the pool holds ids."""

    async def host_ids_between(self, first: int, last: int) -> set[int]:
        return set()


async def _claim_then_count_creates(tmp_path: Path, delay: float) -> tuple[int, int]:
    """(creates, available) a few loop turns after a claim, with the refill waiting `delay`."""
    engine = FakeEngine()
    config = Config(data_dir=tmp_path, pool_size=1)
    template = pool_template(config, "owner", "gen")
    pool = WarmPool(
        engine,
        size=1,
        owner_id="owner",
        template=template,
        generation="gen",
        host_ids=HostIds.for_config(config, _NoRecords()),
        refill_delay_s=delay,
    )
    pool.start()
    try:
        await _filled(pool, 1)
        claimed = await pool.claim(template)
        assert claimed is not None
        pool.settled(claimed.container_id)
        if delay == 0:
            await _filled(pool, 1)
        for _ in range(50):
            await asyncio.sleep(0)
        return engine.calls.count("create_sandbox"), pool.available
    finally:
        await pool.close()


async def test_a_claims_refill_waits_so_the_claimants_first_commands_go_first(
    tmp_path: Path,
) -> None:
    """The replacement's create+start is not started while the claimant begins its work (it
    would compete for the engine and the CPU with the session's first Run)."""
    assert await _claim_then_count_creates(tmp_path, 3600) == (1, 0)
    assert await _claim_then_count_creates(tmp_path, 0) == (2, 1)
