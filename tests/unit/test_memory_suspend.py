"""Suspend with memory on the engine fake: who is refused before anything stops, what each
failure leaves (running, or suspended from the filesystem snapshot, and saying which), a restore
that fails keeps the checkpoint, an altered checkpoint is never started, ten cycles in a row,
a server restart in between, and the checkpoint removed with the session. No Docker; seconds.

The fake's "memory" is its workspace (as gVisor's is the tmpfs workspace): a checkpoint holds
it, a restore puts it back without any filesystem restore (no `tar -x` exec)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from fakes import FakeEngine
from sandboxd.errors import FailedPrecondition, Internal, NotFound, ResourceExhausted, SandboxError
from sandboxd.isolation import Isolation, IsolationTiers
from sandboxd.models import SessionState, SuspendMode
from sandboxd.reasons import Reason
from sandboxd.sessions import CreateSessionInput
from session_stack import Stack, session_stack

GVISOR = Isolation.GVISOR


async def _tiers(engine: FakeEngine) -> IsolationTiers:
    tiers = IsolationTiers(Isolation.RUNC, {Isolation.RUNC, GVISOR})
    await tiers.refresh(engine)
    return tiers


def _gvisor_engine() -> FakeEngine:
    engine = FakeEngine()
    engine.tiers.add(GVISOR)
    return engine


async def _gvisor_session(st: Stack, session_id: str = "m") -> str:
    s = await st.sessions.create(CreateSessionInput(session_id=session_id, isolation=GVISOR))
    st.engine.sandboxes[s.container_id].files["mem.txt"] = b"in memory"
    return s.container_id


@pytest.mark.parametrize("why", ["runc session", "engine not experimental"])
async def test_refused_before_anything_is_stopped(tmp_path: Path, why: str) -> None:
    engine = _gvisor_engine()
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        if why == "runc session":
            s = await st.sessions.create(CreateSessionInput(session_id="m"))
            sandbox_id = s.container_id
        else:
            sandbox_id = await _gvisor_session(st)
            engine.experimental = False
        engine.calls.clear()
        with pytest.raises(FailedPrecondition) as refused:
            await st.sessions.suspend("m", SuspendMode.MEMORY)
        assert refused.value.reason == Reason.MEMORY_SUSPEND_UNSUPPORTED
        assert "not stopped" in refused.value.message
        # Nothing happened: no snapshot, no checkpoint, no removal, the sandbox runs on.
        assert not {"exec", "checkpoint_sandbox", "remove_sandbox"} & set(engine.calls)
        assert engine.sandboxes[sandbox_id].running
        assert await st.snap_store.of_session("m") == []
        got = await st.sessions.get("m")
        assert (got.state, got.suspend_mode) == (SessionState.RUNNING, SuspendMode.NONE)


async def test_suspend_and_resume_with_memory(tmp_path: Path) -> None:
    engine = _gvisor_engine()
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        first = await _gvisor_session(st)
        lease = (await st.sessions.get("m")).lease_expires_at
        s = await st.sessions.suspend("m", SuspendMode.MEMORY)
        assert (s.state, s.suspend_mode) == (SessionState.SUSPENDED, SuspendMode.MEMORY)
        assert engine.sandboxes == {}
        checkpoint = await st.snap_store.memory_of("m")
        assert checkpoint is not None and checkpoint.size_bytes > 0
        # Stored beside the snapshots, but never listed or restored as a workspace.
        latest = await st.snap_store.latest("m")
        assert latest is not None and latest.kind == "TAR"  # the filesystem net, taken first
        listed = await st.snapshots.list(session_id="m", page_size=100, page_token="")
        assert checkpoint.snapshot_id not in [x.snapshot_id for x in listed[0]]
        got = await st.sessions.get("m")  # as stored
        assert got.suspend_mode is SuspendMode.MEMORY

        engine.calls.clear()
        r = await st.sessions.resume("m", None)
        assert (r.state, r.suspend_mode) == (SessionState.RUNNING, SuspendMode.NONE)
        assert r.container_id and r.container_id != first  # a new sandbox of the same shape
        assert "restore_sandbox" in engine.calls and "start_sandbox" not in engine.calls
        assert "exec" not in engine.calls  # no filesystem restore: it came with the memory
        assert engine.sandboxes[r.container_id].files["mem.txt"] == b"in memory"
        assert st.resumed == ["m"]  # the kept processes are adopted again
        assert await st.snap_store.memory_of("m") is None  # consumed
        assert r.lease_expires_at >= lease  # the time suspended is not the lease's


async def test_ten_cycles_in_a_row_and_a_server_restart(tmp_path: Path) -> None:
    engine = _gvisor_engine()
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        await _gvisor_session(st)
        for i in range(10):
            await st.sessions.suspend("m", SuspendMode.MEMORY)
            r = await st.sessions.resume("m", None)
            engine.sandboxes[r.container_id].files["mem.txt"] += str(i).encode()
        await st.sessions.suspend("m", SuspendMode.MEMORY)
    # Another server over the same data directory, and an engine that never saw the session.
    engine = _gvisor_engine()
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        r = await st.sessions.resume("m", None)
        assert engine.sandboxes[r.container_id].files["mem.txt"] == b"in memory0123456789"


async def test_a_checkpoint_that_fails_while_running_leaves_it_running(tmp_path: Path) -> None:
    engine = _gvisor_engine()
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        sandbox_id = await _gvisor_session(st)
        engine.fail("checkpoint_sandbox")
        with pytest.raises(Internal) as failed:
            await st.sessions.suspend("m", SuspendMode.MEMORY)
        assert "runs on as it was" in failed.value.message
        assert failed.value.metadata["session_state"] == "RUNNING"
        got = await st.sessions.get("m")
        assert (got.state, got.container_id) == (SessionState.RUNNING, sandbox_id)
        assert engine.sandboxes[sandbox_id].running


@pytest.mark.parametrize("step", ["checkpoint_sandbox:after", "read_checkpoint"])
async def test_past_the_point_of_no_return_it_is_suspended_from_the_filesystem(
    tmp_path: Path, step: str
) -> None:
    engine = _gvisor_engine()
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        await _gvisor_session(st)
        engine.fail(step)
        with pytest.raises(Internal) as failed:
            await st.sessions.suspend("m", SuspendMode.MEMORY)
        assert "filesystem snapshot" in failed.value.message
        assert failed.value.metadata["suspend_mode"] == "FILESYSTEM"
        got = await st.sessions.get("m")
        assert (got.state, got.suspend_mode) == (SessionState.SUSPENDED, SuspendMode.FILESYSTEM)
        assert engine.sandboxes == {} and await st.snap_store.memory_of("m") is None
        r = await st.sessions.resume("m", None)  # the workspace, from its snapshot
        assert engine.sandboxes[r.container_id].files["mem.txt"] == b"in memory"
        assert "start_sandbox" in engine.calls


@pytest.mark.parametrize("step", ["restore_sandbox", "restore_sandbox:placed"])
async def test_a_restore_that_fails_keeps_the_checkpoint(tmp_path: Path, step: str) -> None:
    engine = _gvisor_engine()
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        await _gvisor_session(st)
        await st.sessions.suspend("m", SuspendMode.MEMORY)
        engine.fail(step)
        with pytest.raises(Internal):
            await st.sessions.resume("m", None)
        got = await st.sessions.get("m")
        assert (got.state, got.suspend_mode) == (SessionState.SUSPENDED, SuspendMode.MEMORY)
        assert engine.sandboxes == {}, "the half-made sandbox was left"
        assert await st.snap_store.memory_of("m") is not None
        r = await st.sessions.resume("m", None)  # another try
        assert engine.sandboxes[r.container_id].files["mem.txt"] == b"in memory"


async def test_an_altered_checkpoint_is_never_started(tmp_path: Path) -> None:
    engine = _gvisor_engine()
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        await _gvisor_session(st)
        await st.sessions.suspend("m", SuspendMode.MEMORY)
        checkpoint = await st.snap_store.memory_of("m")
        assert checkpoint is not None
        path = st.snap_store.path_of(checkpoint.sha256)
        path.write_bytes(path.read_bytes().replace(b"in memory", b"in MEMORY"))
        with pytest.raises(SandboxError) as refused:
            await st.sessions.resume("m", None)
        assert "digest" in refused.value.message
        assert engine.sandboxes == {}
        got = await st.sessions.get("m")
        assert (got.state, got.suspend_mode) == (SessionState.SUSPENDED, SuspendMode.FILESYSTEM)
        r = await st.sessions.resume("m", None)  # from the filesystem snapshot taken first
        assert engine.sandboxes[r.container_id].files["mem.txt"] == b"in memory"


async def test_the_checkpoint_goes_with_the_session(tmp_path: Path) -> None:
    engine = _gvisor_engine()
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        await _gvisor_session(st)
        await st.sessions.suspend("m", SuspendMode.MEMORY)
        checkpoint = await st.snap_store.memory_of("m")
        assert checkpoint is not None
        await st.sessions.delete("m")
        assert await st.snap_store.memory_of("m") is None
        assert not st.snap_store.path_of(checkpoint.sha256).exists()


async def test_the_lease_does_not_count_the_time_suspended(tmp_path: Path) -> None:
    engine = _gvisor_engine()
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        await _gvisor_session(st)
        await st.sessions.suspend("m", SuspendMode.MEMORY)
        checkpoint = await st.snap_store.memory_of("m")
        assert checkpoint is not None
        lease = (await st.sessions.get("m")).lease_expires_at
        # As if it had been suspended an hour ago.
        await st.store.db.execute(
            "UPDATE snapshots SET created_at = created_at - 3600 WHERE snapshot_id = ?",
            (checkpoint.snapshot_id,),
        )
        r = await st.sessions.resume("m", None)
        assert r.lease_expires_at - lease >= timedelta(seconds=3599)


def test_a_kept_process_clock_does_not_count_the_pauses() -> None:
    """The sandbox's monotonic clock jumps by a memory suspend's length at the restore; the
    age the agent reports includes it, the deadline the server keeps must not."""
    from sandboxd.processes.adoption import kept_clock

    now = 10_000.0
    record = {"age_ms": 100_000, "timeout_ms": 60_000}  # started at 9900, real time
    pauses = [(9000.0, 9500.0), (9910.0, 9950.0), (9960.0, 9990.0)]  # the first before it
    clock = kept_clock(record, pauses, now)
    assert clock.age_s == 100 - 40 - 30 and clock.timeout_s == 60
    ended = {"age_ms": 100_000, "ran_ms": 50_000}  # ran 9900..9950: one pause of 40 s in it
    assert kept_clock(ended, pauses, now).ran_s == 10
    assert kept_clock(record).age_s == 100  # never suspended: as the agent said


async def test_a_checkpoint_is_no_snapshot_a_tenant_can_reach(tmp_path: Path) -> None:
    """Its record sits beside the snapshots, but GetSnapshot, a fork or a restore by its id
    answer NOT_FOUND: it is no workspace tar, and never leaves the session it came from."""
    engine = _gvisor_engine()
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        await _gvisor_session(st)
        await st.sessions.suspend("m", SuspendMode.MEMORY)
        checkpoint = await st.snap_store.memory_of("m")
        assert checkpoint is not None
        with pytest.raises(NotFound):
            await st.snapshots.get(checkpoint.snapshot_id)
        with pytest.raises(NotFound):
            await st.sessions.create(
                CreateSessionInput(session_id="fork", from_snapshot_id=checkpoint.snapshot_id)
            )


async def test_checkpoints_count_against_the_tenants_quota(tmp_path: Path) -> None:
    """A tenant's memory on the server's disk is its quota's (tenant_max_image_bytes): a
    suspend that could pass it is refused before anything stops; a stored one is counted."""
    engine = _gvisor_engine()
    async with session_stack(tmp_path, engine=engine, tiers=await _tiers(engine)) as st:
        quota = st.snapshots._quota
        await _gvisor_session(st)
        memory = (await st.sessions.get("m")).spec.limits.memory_bytes
        quota.quota_bytes = memory  # room for exactly one checkpoint of the session's memory
        await st.sessions.suspend("m", SuspendMode.MEMORY)
        checkpoint = await st.snap_store.memory_of("m")
        assert checkpoint is not None
        assert await quota.used("default") == checkpoint.size_bytes
        await st.sessions.resume("m", None)  # consumed: no longer counted
        assert await quota.used("default") == 0
        quota.quota_bytes = memory - 1
        engine.calls.clear()
        with pytest.raises(ResourceExhausted) as refused:
            await st.sessions.suspend("m", SuspendMode.MEMORY)
        assert refused.value.reason == Reason.TENANT_IMAGE_QUOTA
        assert "checkpoint_sandbox" not in engine.calls and "exec" not in engine.calls
        assert (await st.sessions.get("m")).state is SessionState.RUNNING
