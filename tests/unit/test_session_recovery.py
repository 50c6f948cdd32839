"""The reaper, reconcile and lost or tampered sandboxes, on the engine fake. No Docker."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
import sandboxd.session_rows
from sandboxd.commands import Plain, Where
from sandboxd.engine.protocol import SandboxRequest
from sandboxd.errors import FailedPrecondition, Unavailable
from sandboxd.models import SessionState
from sandboxd.sessions import CreateSessionInput
from sandboxd.sessions.recovery import ENDED_RETENTION
from session_stack import OWNER, session_stack


async def test_reaper_expires_under_the_session_lock(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        await st.sessions.create(CreateSessionInput(session_id="r1"))
        await st.backdate_lease("r1", timedelta(seconds=1))
        async with st.sessions.locked("r1"):
            reaping = asyncio.create_task(st.sessions.reap_once())
            await asyncio.sleep(0.05)
            assert not reaping.done(), "the reaper did not wait for the session's lock"
            # What a renew holding the lock does: the lease is good again.
            session = await st.store.get("r1")
            assert session is not None
            session.lease_expires_at += timedelta(hours=1)
            await st.store.update(session)
        assert await reaping == 0
        stored = await st.store.get("r1")
        assert stored is not None and stored.state is SessionState.RUNNING
        assert stored.container_id in st.engine.sandboxes


async def test_reaper_decodes_no_spec_of_sessions_not_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with session_stack(tmp_path) as st:
        for i in range(20):
            await st.sessions.create(CreateSessionInput(session_id=f"live{i}"))
        await st.sessions.create(CreateSessionInput(session_id="due"))
        await st.backdate_lease("due", timedelta(seconds=1))
        decoded: list[str] = []
        real = sandboxd.session_rows.spec_from_json

        def counting(text: str):  # type: ignore[no-untyped-def]
            decoded.append(text)
            return real(text)

        monkeypatch.setattr(sandboxd.session_rows, "spec_from_json", counting)
        assert await st.sessions.reap_once() == 1
        assert len(decoded) <= 2, f"the reaper decoded {len(decoded)} specs for one due lease"
        decoded.clear()
        assert await st.sessions.reap_once() == 0
        assert decoded == []


async def test_ended_records_are_pruned_after_retention(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        await st.sessions.create(CreateSessionInput(session_id="gone"))
        await st.snapshots.create("gone", {}, "")
        await st.backdate_lease("gone", timedelta(seconds=1))
        await st.sessions.reap_once()
        stored = await st.store.get("gone")
        assert stored is not None and stored.state is SessionState.EXPIRED  # kept a while
        await st.backdate_lease("gone", ENDED_RETENTION + timedelta(seconds=1))
        await st.sessions.reap_once()
        assert await st.store.get("gone") is None
        assert await st.snap_store.of_session("gone") == []


async def test_reconcile_finds_lost_sandboxes_and_removes_orphans(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        lost = await st.sessions.create(CreateSessionInput(session_id="lost"))
        kept = await st.sessions.create(CreateSessionInput(session_id="kept"))
        await st.snapshots.create("kept", {}, "")
        ok = await st.sessions.create(CreateSessionInput(session_id="ok"))
        st.engine.lose(lost.container_id)
        st.engine.stop(kept.container_id)
        orphan = await st.engine.create_sandbox(
            SandboxRequest(spec=ok.spec, owner_id=OWNER, name="orphan", session_id="nobody")
        )
        other = await st.engine.create_sandbox(
            SandboxRequest(spec=ok.spec, owner_id="someone-else", name="theirs")
        )
        await st.sessions.reconcile()
        assert orphan not in st.engine.sandboxes, "an orphan of ours was left"
        assert other in st.engine.sandboxes, "another owner's sandbox was touched"
        assert ok.container_id in st.engine.sandboxes
        states = {s: (await st.sessions.get(s)).state for s in ("lost", "kept", "ok")}
        assert states == {
            "lost": SessionState.FAILED,  # no snapshot: nothing can bring it back
            "kept": SessionState.SUSPENDED,  # rebuilt from its snapshot on the next call
            "ok": SessionState.RUNNING,
        }
        with pytest.raises(FailedPrecondition) as exc:
            await st.sessions.require_running("lost")
        assert exc.value.reason == "CONTAINER_LOST"
        assert (await st.sessions.require_running("kept")).state is SessionState.RUNNING


async def test_reconcile_takes_back_a_create_that_died_with_the_server(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        st.engine.fail("start_sandbox", asyncio.CancelledError())  # type: ignore[arg-type]
        with pytest.raises(asyncio.CancelledError):
            await st.sessions.create(CreateSessionInput(session_id="x"))
        # A server killed mid-create leaves a CREATING record and a sandbox: fake that.
        s = await st.sessions.create(CreateSessionInput(session_id="y"))
        s.state = SessionState.CREATING
        await st.store.update(s)
        await st.sessions.reconcile()
        assert await st.store.get("y") is None and st.engine.sandboxes == {}


async def test_a_tampered_sandbox_is_not_reused(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        a = await st.sessions.create(CreateSessionInput(session_id="a"))
        await st.snapshots.create("a", {}, "")
        st.engine.tamper(a.container_id)
        resumed = await st.sessions.resume("a", None)
        assert resumed.container_id != a.container_id  # rebuilt from the snapshot
        assert a.container_id not in st.engine.sandboxes
        b = await st.sessions.create(CreateSessionInput(session_id="b"))
        st.engine.tamper(b.container_id)
        with pytest.raises(FailedPrecondition) as exc:
            await st.sessions.resume("b", None)
        assert exc.value.reason == "CONTAINER_LOST"


async def test_an_engine_that_lost_the_sandbox_mid_call(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        s = await st.sessions.create(CreateSessionInput(session_id="m"))
        await st.snapshots.create("m", {}, "")
        st.engine.lose(s.container_id)
        with pytest.raises(Unavailable) as exc:
            async with st.sessions.use("m") as session:
                where = Where(session.container_id, "1:1")
                async with st.commands.open(where, Plain(("true",))):
                    pass
        assert exc.value.reason == "CONTAINER_REBUILDING" and exc.value.metadata["retry"] == "true"
        assert (await st.sessions.require_running("m")).state is SessionState.RUNNING


async def test_a_sweep_of_many_live_sessions_makes_no_call_per_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reconcile runs every sweep: once the first has tidied, a live session running in the
    engine's listing costs it no inspect and no locked read of its record (O(live) engine calls
    a minute at a thousand live sessions), and a stopped one is still noted."""
    async with session_stack(tmp_path) as st:
        for i in range(20):
            await st.sessions.create(CreateSessionInput(session_id=f"live{i}"))
        await st.sessions.reconcile()  # the first: tidies what an older server left
        decoded: list[str] = []
        real = sandboxd.session_rows.spec_from_json

        def counting(text: str):  # type: ignore[no-untyped-def]
            decoded.append(text)
            return real(text)

        monkeypatch.setattr(sandboxd.session_rows, "spec_from_json", counting)
        st.engine.calls.clear()
        await st.sessions.reconcile()
        assert st.engine.calls.count("inspect_sandbox") == 0, st.engine.calls
        assert st.engine.calls.count("list_sandboxes") <= 2, st.engine.calls
        assert decoded == [], f"reconcile read {len(decoded)} records of running sessions"
        stopped = await st.store.get("live3")
        assert stopped is not None
        st.engine.stop(stopped.container_id)
        await st.sessions.reconcile()
        assert (await st.sessions.get("live3")).state is not SessionState.RUNNING
        assert (await st.sessions.get("live4")).state is SessionState.RUNNING
