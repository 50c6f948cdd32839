"""Session lifecycle on the engine fake: create, get, renew, delete, the undo of a half-done
create, suspend/resume and the CreateSnapshot/DeleteSession race. No Docker; seconds."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from sandboxd.errors import (
    AlreadyExists,
    FailedPrecondition,
    Internal,
    ResourceExhausted,
    SandboxError,
    SessionNotFound,
)
from sandboxd.models import LimitsRequest, ManifestFile, SessionState, WorkspaceManifest
from sandboxd.sessions import CreateSessionInput
from session_stack import OWNER, session_stack

MANIFEST = WorkspaceManifest(files=(ManifestFile("src/a.txt", b"hello", 0o644),))


async def test_create_get_renew_delete(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        s = await st.sessions.create(CreateSessionInput(session_id="s1", manifest=MANIFEST))
        assert s.state is SessionState.RUNNING
        box = st.engine.sandboxes[s.container_id]
        assert box.running and box.request.session_id == "s1"
        assert box.files == {"src/a.txt": b"hello"}
        got = await st.sessions.get("s1")
        assert (got.state, got.container_id) == (SessionState.RUNNING, s.container_id)
        # The same create again is answered with the same session; a different one refused.
        again = await st.sessions.create(CreateSessionInput(session_id="s1", manifest=MANIFEST))
        assert again.container_id == s.container_id
        with pytest.raises(AlreadyExists):
            await st.sessions.create(CreateSessionInput(session_id="s1"))
        renewed = await st.sessions.renew("s1", 3600)
        assert renewed.lease_expires_at > s.lease_expires_at
        await st.sessions.delete("s1")
        assert st.engine.sandboxes == {} and await st.store.get("s1") is None
        assert st.ended == ["s1"]  # background processes were told
        await st.sessions.delete("s1")  # idempotent
        with pytest.raises(SessionNotFound):
            await st.sessions.get("s1")


@pytest.mark.parametrize(
    "step",
    ["create_sandbox", "create_sandbox:after", "start_sandbox", "exec", "manifest"],
)
async def test_a_create_that_fails_half_way_leaves_nothing(tmp_path: Path, step: str) -> None:
    async with session_stack(tmp_path) as st:
        manifest = MANIFEST
        if step == "manifest":  # tar in the sandbox refuses: the workspace is full
            big = ManifestFile("big", b"x" * 2048, 0o644)
            manifest = WorkspaceManifest(files=(big,))
            limits = LimitsRequest(workspace_bytes=1024, file_bytes=4096)
        else:
            st.engine.fail(step)
            limits = LimitsRequest()
        with pytest.raises(SandboxError) as failed:
            await st.sessions.create(
                CreateSessionInput(session_id="half", manifest=manifest, limits=limits)
            )
        assert isinstance(failed.value, ResourceExhausted if step == "manifest" else Internal)
        assert st.engine.sandboxes == {}, "the sandbox was left behind"
        assert await st.store.get("half") is None, "the record was left behind"
        # And the id is free again.
        assert (await st.sessions.create(CreateSessionInput(session_id="half"))).container_id


async def test_a_cancelled_create_leaves_nothing(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        gate = asyncio.Event()
        original = st.engine.start_sandbox

        async def slow_start(sandbox_id: str) -> None:
            await gate.wait()
            await original(sandbox_id)

        st.engine.start_sandbox = slow_start  # type: ignore[method-assign]
        task = asyncio.create_task(st.sessions.create(CreateSessionInput(session_id="c")))
        while not st.engine.sandboxes:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert st.engine.sandboxes == {} and await st.store.get("c") is None


async def test_reads_have_no_side_effects_and_ended_leases_are_refused(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        s = await st.sessions.create(CreateSessionInput(session_id="old"))
        await st.backdate_lease("old", timedelta(seconds=1))
        calls = len(st.engine.calls)
        got = await st.sessions.get("old")
        listed, _ = await st.sessions.list_sessions({}, 0, "")
        assert got.state is SessionState.RUNNING and [x.state for x in listed] == [got.state]
        assert st.engine.calls[calls:] == [] and s.container_id in st.engine.sandboxes
        stored = await st.store.get("old")
        assert stored is not None and stored.state is SessionState.RUNNING
        # ... but nothing may use it, nor renew it.
        for refused in (st.sessions.require_running("old"), st.sessions.renew("old", 60)):
            with pytest.raises(FailedPrecondition) as exc:
                await refused
            assert exc.value.reason == "LEASE_EXPIRED"
        assert await st.sessions.reap_once() == 1
        assert (await st.sessions.get("old")).state is SessionState.EXPIRED
        assert st.engine.sandboxes == {}


async def test_suspend_and_resume_keep_the_workspace(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        s = await st.sessions.create(CreateSessionInput(session_id="sus", manifest=MANIFEST))
        st.engine.sandboxes[s.container_id].files["later.txt"] = b"written later"
        suspended = await st.sessions.suspend("sus")
        assert suspended.state is SessionState.SUSPENDED and st.engine.sandboxes == {}
        assert st.ended == ["sus"]
        resumed = await st.sessions.resume("sus", None)
        assert resumed.state is SessionState.RUNNING
        files = st.engine.sandboxes[resumed.container_id].files
        assert files == {"src/a.txt": b"hello", "later.txt": b"written later"}
        # A suspended session comes back by itself on the next command, too.
        await st.sessions.suspend("sus")
        again = await st.sessions.require_running("sus")
        assert again.state is SessionState.RUNNING and again.container_id in st.engine.sandboxes


async def test_a_resume_that_fails_stays_suspended_and_leaves_nothing(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        await st.sessions.create(CreateSessionInput(session_id="r"))
        await st.sessions.suspend("r")
        st.engine.fail("start_sandbox")
        with pytest.raises(Internal):
            await st.sessions.resume("r", None)
        stored = await st.store.get("r")
        assert stored is not None and stored.state is SessionState.SUSPENDED
        assert st.engine.sandboxes == {}
        assert (await st.sessions.resume("r", None)).state is SessionState.RUNNING


async def test_fork_starts_from_a_snapshot(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        await st.sessions.create(CreateSessionInput(session_id="parent", manifest=MANIFEST))
        snap = await st.snapshots.create("parent", {}, "")
        fork = await st.sessions.create(
            CreateSessionInput(session_id="fork", from_snapshot_id=snap.snapshot_id)
        )
        assert st.engine.sandboxes[fork.container_id].files == {"src/a.txt": b"hello"}
        assert await st.snap_store.latest("fork") is not None  # rebuildable on its own


async def test_snapshot_racing_delete_leaves_no_orphan(tmp_path: Path) -> None:
    async with session_stack(tmp_path) as st:
        await st.sessions.create(CreateSessionInput(session_id="race", manifest=MANIFEST))
        st.archive.export_gate = asyncio.Event()
        st.archive.exported = asyncio.Event()
        taking = asyncio.create_task(st.snapshots.create("race", {}, "IMAGE"))
        await st.archive.exported.wait()
        await st.sessions.delete("race")  # runs while the export's stream is still open
        st.archive.export_gate.set()
        with pytest.raises(SessionNotFound):
            await taking
        assert await st.snap_store.of_session("race") == []
        assert [p for p in (tmp_path / "snapshots").rglob("*") if p.is_file()] == []
        owned = [i for i, labels in st.engine.images.items() if labels.get("io.sandboxd.owner")]
        assert owned == [], "the snapshot's image was left behind"
        assert OWNER  # the stack's owner id labelled the image
