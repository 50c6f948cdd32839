"""The session records and lease terms kept in memory stay the database's word: every write
reaches memory only after its commit, a failed write leaves what is stored, a read that raced a
write keeps nothing stale, and a restart (a new store on the same file) sees exactly what was
committed, so a crash between a write and memory neither loses nor resurrects a state."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sandboxd.config import DEFAULT_LIMITS
from sandboxd.leases.terms import SUSPEND, LeaseTermsStore
from sandboxd.models import (
    Loss,
    NetworkPolicy,
    Session,
    SessionSpec,
    SessionState,
    ShellPolicy,
    WorkspaceManifest,
)
from sandboxd.store import SessionStore


def _session(session_id: str = "s-1") -> Session:
    spec = SessionSpec(
        image="img",
        limits=DEFAULT_LIMITS,
        shell=ShellPolicy(allow_all=True),
        network=NetworkPolicy(),
        env={},
        uid=65534,
        gid=65534,
        manifest=WorkspaceManifest(),
    )
    at = datetime.now(UTC)
    return Session(
        session_id=session_id,
        spec=spec,
        fingerprint=spec.fingerprint(),
        state=SessionState.RUNNING,
        created_at=at,
        lease_expires_at=at + timedelta(minutes=5),
        labels={"a": "1"},
        container_id="c-1",
        tenant="t1",
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SessionStore]:
    async with SessionStore(tmp_path / "sessions.db") as s:
        yield s


async def _fresh(path: Path, session_id: str) -> Session | None:
    """What a restarted server reads: a new store on the same file, nothing in memory."""
    async with SessionStore(path) as other:
        return await other.get(session_id)


class _Failing:
    """The connection, but its next `execute` fails (the disk, a crash mid-write)."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.armed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        if self.armed:
            self.armed = False
            raise OSError("disk I/O error")
        return self._db.execute(*args, **kwargs)


async def test_writes_reach_reads_and_copies_are_the_callers(store: SessionStore) -> None:
    await store.insert(_session())
    first = await store.get("s-1")
    assert first is not None
    first.labels["b"] = "2"  # a caller changing its copy and never writing it
    first.state = SessionState.SUSPENDED
    again = await store.get("s-1")
    assert again is not None and again.labels == {"a": "1"}
    assert again.state is SessionState.RUNNING
    again.state = SessionState.SUSPENDED
    again.loss = Loss(lost_at=datetime.now(UTC))
    await store.update(again)
    read = await store.get("s-1")
    assert read is not None and read.state is SessionState.SUSPENDED and read.loss is not None
    assert read == await _fresh(store._path, "s-1")  # memory as a restart would read it
    await store.delete("s-1")
    assert await store.get("s-1") is None


async def test_a_failed_write_leaves_the_stored_state(store: SessionStore) -> None:
    await store.insert(_session())
    kept = await store.get("s-1")  # in memory now
    assert kept is not None
    changed = dataclasses.replace(kept, state=SessionState.EXPIRED)
    failing = _Failing(store._db)
    store._db = failing  # type: ignore[assignment]
    with pytest.raises(OSError):
        await store.update(changed)
    store._db = failing._db
    read = await store.get("s-1")
    assert read is not None and read.state is SessionState.RUNNING  # not the unwritten EXPIRED
    store._db = failing = _Failing(store._db)  # type: ignore[assignment]
    with pytest.raises(OSError):
        await store.delete("s-1")
    store._db = failing._db
    assert await store.get("s-1") is not None  # not deleted: it is still stored


async def test_a_restart_reads_what_was_committed(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    async with SessionStore(path) as store:
        await store.insert(_session())
        s = await store.get("s-1")
        assert s is not None
        s.state = SessionState.SUSPENDED
        await store.update(s)
        # the "crash": the process ends here, whatever memory held
    restarted = await _fresh(path, "s-1")
    assert restarted is not None and restarted.state is SessionState.SUSPENDED
    async with SessionStore(path) as store:
        await store.delete("s-1")
    assert await _fresh(path, "s-1") is None  # a deleted record does not come back


async def test_a_read_racing_a_write_keeps_nothing_stale(store: SessionStore) -> None:
    await store.insert(_session())
    gate = asyncio.Event()
    real_read = store._read

    async def slow_read(session_id: str) -> Session | None:
        found = await real_read(session_id)  # the old record...
        await gate.wait()  # ...held back until the write below has committed
        return found

    store._read = slow_read  # type: ignore[method-assign]
    reader = asyncio.create_task(store.get("s-1"))
    await asyncio.sleep(0.05)
    store._read = real_read  # type: ignore[method-assign]
    newer = _session()
    newer.state = SessionState.SUSPENDED
    await store.update(newer)
    gate.set()
    stale = await reader
    assert stale is not None and stale.state is SessionState.RUNNING  # what it read then
    now = await store.get("s-1")
    assert now is not None and now.state is SessionState.SUSPENDED


async def test_lease_terms_follow_every_write(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    async with SessionStore(path) as sessions:
        terms = await LeaseTermsStore(sessions.db).open()
        await sessions.insert(_session())
        assert not (await terms.get("s-1")).renew_on_activity  # defaults, now in memory
        await terms.set_terms("s-1", SUSPEND, True)
        assert (await terms.get("s-1")).renew_on_activity
        await terms.set_end_reason("s-1", "lease expired")
        assert (await terms.get("s-1")).end_reason == "lease expired"
        failing = _Failing(terms._db)
        terms._db = failing  # type: ignore[assignment]
        with pytest.raises(OSError):
            await terms.set_terms("s-1", SUSPEND, False)
        terms._db = failing._db
        assert (await terms.get("s-1")).renew_on_activity  # the failed write changed nothing
        await sessions.delete("s-1")
        await terms.forget_orphans()
        assert (await terms.get("s-1")).end_reason == ""  # its row went with the session
    async with SessionStore(path) as sessions:
        terms = await LeaseTermsStore(sessions.db).open()
        assert (await terms.get("s-1")).end_reason == ""  # and stays gone after a restart
