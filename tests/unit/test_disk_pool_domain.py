"""The warm pool where the operator's default storage is disk, over the engine fake: members are
disk workspaces with their disk made for their own host uid, a claimant of the default size gets
the member with its disk and uid, another size misses the pool, a member never used takes its
disk with it (drained or discarded), and the sweep keeps a member's disk and removes a dead
server's."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fakes import FakeEngine
from sandboxd.config_sections.units import GiB, MiB
from sandboxd.errors import Internal
from sandboxd.models import WorkspaceStorage
from sandboxd.sessions import CreateSessionInput
from session_stack import Stack, session_stack


async def _filled(st: Stack, engine: FakeEngine) -> set[str]:
    assert st.pool is not None
    st.pool.start()
    for _ in range(300):
        if st.pool.available >= 1:
            break
        await asyncio.sleep(0.01)
    assert st.pool.available >= 1
    return set(engine.sandboxes)


async def test_a_disk_member_is_handed_out_with_its_disk_and_uid(tmp_path: Path) -> None:
    engine = FakeEngine()
    async with session_stack(
        tmp_path, pool_size=1, engine=engine, default_workspace_storage="disk"
    ) as st:
        members = await _filled(st, engine)
        (member,) = members
        member_disk = engine.sandboxes[member].request.spec.disk_id
        disk = engine.disks.disks[member_disk]
        assert disk.size_bytes == 10 * GiB  # default_disk_bytes
        made = await st.sessions.create(CreateSessionInput(session_id="d1"))
        assert made.container_id == member  # from the pool
        assert made.spec.on_disk and made.spec.disk_id == member_disk
        assert (disk.uid, disk.gid) == (made.spec.uid, made.spec.gid)
        stored = await st.store.get("d1")
        assert stored is not None and stored.spec.disk_id == member_disk
        # Another size misses the pool: a cold create on a disk of its own.
        refilled = await _filled(st, engine) - {member}
        other = await st.sessions.create(
            CreateSessionInput(session_id="d2", storage=WorkspaceStorage.DISK, size_bytes=512 * MiB)
        )
        assert other.container_id not in refilled
        assert engine.disks.disks[other.spec.disk_id].size_bytes == 512 * MiB
        # The session's disk goes with it, as a cold one's does.
        assert await st.sessions.delete("d1")
        assert member_disk not in engine.disks.disks


async def test_the_sweep_keeps_members_disks_and_a_drained_pool_takes_them(
    tmp_path: Path,
) -> None:
    engine = FakeEngine()
    async with session_stack(
        tmp_path, pool_size=1, engine=engine, default_workspace_storage="disk"
    ) as st:
        assert st.pool is not None
        await _filled(st, engine)
        member_disks = set(engine.disks.disks)
        assert len(member_disks) == 1
        dead = "ws-" + "ab" * 12  # a dead server's member: no record, no pool holds it
        await engine.disks.create(dead, 64 * MiB, 1000, 1000)
        await st.sessions.reconcile()
        assert set(engine.disks.disks) == member_disks
        await st.pool.close()
        assert engine.disks.disks == {}


async def test_the_first_sweep_detaches_the_loops_of_removed_disk_images(tmp_path: Path) -> None:
    """A disk image volume removed past the API (a cleanup's `docker volume rm`) leaves its
    loop attached on a deleted file: the first sweep reaps it, once; without the disk tool
    the sweep goes on."""
    engine = FakeEngine()
    async with session_stack(tmp_path, engine=engine) as st:
        engine.disks.orphan_loops = ["/dev/loop0", "/dev/loop1"]
        await st.sessions.reconcile()
        assert engine.disks.orphan_loops == [] and engine.calls.count("disks.reap") == 1
        engine.disks.orphan_loops = ["/dev/loop2"]
        await st.sessions.reconcile()  # once per start: the tool container costs
        assert engine.calls.count("disks.reap") == 1
    bare = FakeEngine()
    bare.disks.tool = False
    async with session_stack(tmp_path / "b", engine=bare) as st:
        await st.sessions.reconcile()
        await st.sessions.reconcile()
        assert bare.calls.count("disks.reap") == 1  # no tool: nothing to reap, not retried
    failing = FakeEngine()
    async with session_stack(tmp_path / "c", engine=failing) as st:
        failing.fail("disks.reap", Internal("the tool died"))
        failing.disks.orphan_loops = ["/dev/loop3"]
        await st.sessions.reconcile()  # a failed reap: the next sweep tries again
        await st.sessions.reconcile()
        assert failing.disks.orphan_loops == [] and failing.calls.count("disks.reap") == 2
