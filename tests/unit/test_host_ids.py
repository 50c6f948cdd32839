"""Each session's own host uid (sandboxd.host_ids) over the session domain and a real SQLite
store: from the operator's block, never held by two sessions (suspended ones and records a
restarted server finds included), freed by DeleteSession, a clear refusal when the block is
used up, warm containers' ids handed to the session that claims them. No Docker."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from sandboxd.config import Config, validate
from sandboxd.errors import ConfigError, ResourceExhausted, SandboxError
from sandboxd.host_ids import HostIds
from sandboxd.models import LimitsRequest
from sandboxd.pool import WarmPool
from sandboxd.sessions import CreateSessionInput
from sandboxd.store import SessionStore
from session_stack import session_stack

FIRST = 3_000_000


async def _filled(pool: WarmPool) -> None:
    for _ in range(500):
        if pool.available:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the pool did not fill")


def _uid(user: str) -> int:
    uid, _, gid = user.partition(":")
    assert uid == gid
    return int(uid)


async def test_each_session_gets_its_own_id_from_the_block_whatever_it_asked(
    tmp_path: Path,
) -> None:
    async with session_stack(tmp_path, host_uid_first=FIRST, host_uid_count=8) as st:
        made = [
            await st.sessions.create(CreateSessionInput(session_id=f"s{i}", user="1000:1000"))
            for i in range(4)
        ]
        ids = {_uid(s.spec.user) for s in made}
        assert len(ids) == 4 and all(FIRST <= i < FIRST + 8 for i in ids)
        # The container runs as it; the request's user stays what was asked (fingerprinted).
        for s in made:
            assert st.engine.sandboxes[s.container_id].request.spec.user == s.spec.user
            assert s.spec.requested_user == "1000:1000"
        # A retried create (same id, same request) is the same session, with the same uid.
        again = await st.sessions.create(CreateSessionInput(session_id="s0", user="1000:1000"))
        assert again.spec.user == made[0].spec.user and again.container_id == made[0].container_id


async def test_an_id_is_held_while_suspended_and_freed_by_delete(tmp_path: Path) -> None:
    async with session_stack(tmp_path, host_uid_first=FIRST, host_uid_count=2) as st:
        a = await st.sessions.create(CreateSessionInput(session_id="a"))
        b = await st.sessions.create(CreateSessionInput(session_id="b"))
        assert {_uid(a.spec.user), _uid(b.spec.user)} == {FIRST, FIRST + 1}
        await st.sessions.suspend("a")
        with pytest.raises(ResourceExhausted) as refused:
            await st.sessions.create(CreateSessionInput(session_id="c"))
        assert refused.value.reason == "HOST_IDS_EXHAUSTED"
        assert await st.store.get("c") is None and len(st.engine.sandboxes) == 1  # nothing made
        # The suspended session resumes with its own uid, its sandbox too.
        resumed = await st.sessions.resume("a", None)
        assert resumed.spec.user == a.spec.user
        assert st.engine.sandboxes[resumed.container_id].request.spec.user == a.spec.user
        await st.sessions.delete("a")
        c = await st.sessions.create(CreateSessionInput(session_id="c"))
        assert c.spec.user == a.spec.user  # the only free one: a's, freed by its delete


async def test_ids_of_records_a_restarted_server_finds_are_not_given_out(tmp_path: Path) -> None:
    async with session_stack(tmp_path, host_uid_first=FIRST, host_uid_count=3) as st:
        a = await st.sessions.create(CreateSessionInput(session_id="a"))
        await st.sessions.create(CreateSessionInput(session_id="b"))
        await st.sessions.suspend("b")
        b = await st.store.get("b")
        assert b is not None
        held = {_uid(a.spec.user), _uid(b.spec.user)}
    # A new server process: nothing in memory, the same database.
    async with SessionStore(tmp_path / "sessions.db") as store:
        ids = HostIds(store, FIRST, 3)
        free = await ids.take()
        assert free not in held
        with pytest.raises(ResourceExhausted):
            await ids.take()  # held by `free` until released, the rest by the records
        ids.release(free)
        assert await ids.take() == free


async def test_concurrent_creates_never_share_an_id(tmp_path: Path) -> None:
    async with session_stack(tmp_path, host_uid_first=FIRST, host_uid_count=3) as st:
        results = await asyncio.gather(
            *(st.sessions.create(CreateSessionInput(session_id=f"c{i}")) for i in range(6)),
            return_exceptions=True,
        )
        made = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, ResourceExhausted)]
        assert len(made) == 3 and len(refused) == 3, results
        assert len({s.spec.user for s in made}) == 3
        assert all(r.reason == "HOST_IDS_EXHAUSTED" for r in refused)


async def test_a_fork_gets_its_own_id(tmp_path: Path) -> None:
    async with session_stack(tmp_path, host_uid_first=FIRST, host_uid_count=4) as st:
        parent = await st.sessions.create(CreateSessionInput(session_id="parent"))
        snap = await st.snapshots.create("parent", {}, "")
        fork = await st.sessions.create(
            CreateSessionInput(session_id="fork", from_snapshot_id=snap.snapshot_id)
        )
        assert fork.spec.user != parent.spec.user


async def test_a_warm_container_brings_its_own_id_and_the_pool_holds_one_per_member(
    tmp_path: Path,
) -> None:
    async with session_stack(tmp_path, pool_size=1, host_uid_first=FIRST, host_uid_count=3) as st:
        assert st.pool is not None
        st.pool.start()
        await _filled(st.pool)
        (member,) = st.engine.sandboxes.values()
        member_user = member.request.spec.user
        s = await st.sessions.create(CreateSessionInput(session_id="warm"))
        assert s.container_id == member.sandbox_id and s.spec.user == member_user
        stored = await st.store.get("warm")
        assert stored is not None and stored.spec.user == member_user
        # A cold session (another shape) and the refilled member each hold another id.
        cold = await st.sessions.create(
            CreateSessionInput(session_id="cold", limits=LimitsRequest(pids=32))
        )
        await _filled(st.pool)
        users = {b.request.spec.user for b in st.engine.sandboxes.values()}
        assert len(users) == 3 and {s.spec.user, cold.spec.user} <= users
        with pytest.raises(ResourceExhausted):
            await st.sessions.create(
                CreateSessionInput(session_id="more", limits=LimitsRequest(pids=16))
            )


@pytest.mark.parametrize(
    ("first", "count", "keeper", "problem"),
    [
        (60_000, 10_000, "65533:65533", "keeper's uid"),
        (70_000, 10, "70005:1", "keeper's uid"),
        (70_000, 10, "1:70009", "keeper's gid"),
        (65_000, 1_000, "2:2", "nobody"),
        (65_535, 1, "2:2", "16-bit"),
        (2**31 - 10, 11, "2:2", "above"),
    ],
)
def test_a_block_holding_a_reserved_id_stops_the_server(
    tmp_path: Path, first: int, count: int, keeper: str, problem: str
) -> None:
    config = Config(
        data_dir=tmp_path, host_uid_first=first, host_uid_count=count, keeper_user=keeper
    )
    with pytest.raises(ConfigError, match=problem):
        validate(config)


def test_the_default_block_is_valid_and_apart_from_every_reserved_id(tmp_path: Path) -> None:
    engine = Config(data_dir=tmp_path).engine
    first, last = engine.host_uid_first, engine.host_uid_first + engine.host_uid_count - 1
    assert 1_879_048_192 <= first and last < 2_147_352_576  # systemd's unused span
    assert not first <= 65534 <= last


async def test_an_ended_record_keeps_its_id_while_its_sandbox_could_not_be_removed(
    tmp_path: Path,
) -> None:
    """A failed session past its lease and retention whose sandbox the engine will not
    remove: the reaper keeps the record, and so its uid, so no new session runs as the uid of
    processes still alive in the old sandbox; the reap that removes the sandbox frees it."""
    from datetime import timedelta

    from sandboxd.models import SessionState
    from sandboxd.sessions.recovery import ENDED_RETENTION

    async with session_stack(tmp_path, host_uid_first=FIRST, host_uid_count=1) as st:
        a = await st.sessions.create(CreateSessionInput(session_id="a"))
        stored = await st.store.get("a")
        assert stored is not None
        stored.state = SessionState.FAILED
        await st.store.update(stored)
        await st.backdate_lease("a", ENDED_RETENTION + timedelta(minutes=1))
        st.engine.fail("remove_sandbox")
        with contextlib.suppress(SandboxError):  # the reaper tries again at its next round
            await st.sessions.reap_once()
        assert a.container_id in st.engine.sandboxes  # the engine kept it
        assert await st.store.get("a") is not None, "the record went while its sandbox stayed"
        with pytest.raises(ResourceExhausted) as refused:
            await st.sessions.create(CreateSessionInput(session_id="b"))
        assert refused.value.reason == "HOST_IDS_EXHAUSTED"
        await st.sessions.reap_once()  # the engine answers now: sandbox, then record, go
        assert a.container_id not in st.engine.sandboxes and await st.store.get("a") is None
        b = await st.sessions.create(CreateSessionInput(session_id="b"))
        assert _uid(b.spec.user) == _uid(a.spec.user)
