"""Session events without Docker: the hub's numbering, replay window, EVENTS_LOST marker and
slow-watcher overflow; state changes and renewals observed at the store (every path that
changes a session, the reaper's expiry included); lease warnings before the end."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fakes import FakeArchive, FakeCommands, FakeEngine
from sandboxd.config import Config
from sandboxd.events import EventHub, LeaseWarner, ObservedStore, SessionEvent
from sandboxd.events.hub import WATCH_QUEUE
from sandboxd.sessions import CreateSessionInput, SessionManager
from sandboxd.snapshot_store import SnapshotStore
from sandboxd.snapshots import SnapshotKeeper


def _all(_: SessionEvent) -> bool:
    return True


async def _take(it: AsyncIterator[SessionEvent], n: int) -> list[SessionEvent]:
    return [await asyncio.wait_for(anext(it), 2) for _ in range(n)]


async def test_sequences_are_per_tenant_and_replay_after_a_sequence() -> None:
    hub = EventHub(first_sequence=100)
    a = [hub.publish("alpha", "s1", "LEASE_RENEWED", n=i) for i in range(3)]
    b = hub.publish("beta", "s2", "LEASE_RENEWED")
    assert [e.sequence for e in a] == [100, 101, 102] and b.sequence == 100
    watch = hub.watch("alpha", 100, _all)
    replayed = await _take(watch, 2)
    assert [e.sequence for e in replayed] == [101, 102]
    live = hub.publish("alpha", "s1", "PROCESS_EXITED")
    hub.publish("beta", "s2", "PROCESS_EXITED")  # another tenant's: never seen here
    assert (await _take(watch, 1))[0] == live
    await watch.aclose()


async def test_a_sequence_older_than_the_window_gets_events_lost_first() -> None:
    hub = EventHub(window=5, first_sequence=1)
    for i in range(20):
        hub.publish("alpha", "s1", "PROCESS_EXITED", n=i)
    watch = hub.watch("alpha", 3, _all, session_id="s1")
    got = await _take(watch, 6)
    assert got[0].kind == "EVENTS_LOST"
    assert got[0].attributes == {"from_sequence": "4", "to_sequence": "15"}
    assert [e.sequence for e in got[1:]] == [16, 17, 18, 19, 20]
    await watch.aclose()


async def test_a_restarted_server_numbers_above_the_last_run() -> None:
    first = EventHub()
    last = first.publish("alpha", "s1", "STATE_CHANGED").sequence
    await asyncio.sleep(0.001)
    second = EventHub()
    assert second.publish("alpha", "s1", "STATE_CHANGED").sequence > last
    # A watcher reconnecting with the old run's sequence is told it lost events.
    watch = second.watch("alpha", last, _all)
    assert (await _take(watch, 1))[0].kind == "EVENTS_LOST"
    await watch.aclose()


async def test_a_slow_watcher_is_told_it_lost_events_and_goes_on() -> None:
    hub = EventHub(window=10, first_sequence=1)
    watch = hub.watch("alpha", 0, _all)
    first = hub.publish("alpha", "s1", "PROCESS_STARTED")
    assert (await _take(watch, 1))[0] == first  # the watcher is registered
    for i in range(WATCH_QUEUE + 50):  # more than its queue: the hub never blocks
        hub.publish("alpha", "s1", "PROCESS_EXITED", n=i)
    newest = first.sequence + WATCH_QUEUE + 50
    got: list[SessionEvent] = []
    while not got or got[-1].sequence != newest:
        got += await _take(watch, 1)
    lost = [e for e in got if e.kind == "EVENTS_LOST"]
    assert len(lost) == 1
    tail = got[got.index(lost[0]) + 1 :]
    # After the marker: the replay window, in order, up to the newest event.
    assert [e.sequence for e in tail] == list(range(newest - 9, newest + 1))
    await watch.aclose()


@contextlib.asynccontextmanager
async def _observed(
    tmp_path: Path,
) -> AsyncIterator[tuple[EventHub, ObservedStore, SessionManager]]:
    hub = EventHub(first_sequence=1)
    config = dataclasses.replace(Config(data_dir=tmp_path))
    engine = FakeEngine()
    async with ObservedStore(tmp_path / "sessions.db", hub) as store:
        snap_store = await SnapshotStore(store.db, tmp_path / "snapshots").open()
        keeper = SnapshotKeeper(snap_store, FakeArchive(engine), engine, "sbxunit")
        commands = FakeCommands(engine)
        yield (
            hub,
            store,
            SessionManager(config, engine, store, "sbxunit", keeper, commands=commands),
        )


async def test_every_state_change_and_renewal_is_an_event(tmp_path: Path) -> None:
    async with _observed(tmp_path) as (hub, store, sessions):
        watch = hub.watch("default", 0, lambda e: e.session_id == "s1")
        await sessions.create(CreateSessionInput(session_id="s1", labels={"team": "a"}))
        await sessions.renew("s1", 3600)
        await sessions.suspend("s1")
        await sessions.resume("s1", None)
        s = await store.get("s1")
        assert s is not None
        s.lease_expires_at = datetime.now(UTC) - timedelta(seconds=1)
        await store.update(s)
        assert await sessions.reap_once() == 1  # the reaper's expiry is seen too
        await sessions.delete("s1")
        got = await _take(watch, 7)
        assert [(e.kind, e.state) for e in got] == [
            ("STATE_CHANGED", "SESSION_STATE_CREATING"),
            ("STATE_CHANGED", "SESSION_STATE_RUNNING"),
            ("LEASE_RENEWED", "SESSION_STATE_RUNNING"),
            ("STATE_CHANGED", "SESSION_STATE_SUSPENDED"),
            ("STATE_CHANGED", "SESSION_STATE_RUNNING"),
            ("STATE_CHANGED", "SESSION_STATE_EXPIRED"),
            ("STATE_CHANGED", ""),
        ]
        assert got[-1].attributes == {"deleted": "true"}
        assert [e.sequence for e in got] == sorted(e.sequence for e in got)
        await watch.aclose()


async def test_lease_warning_once_per_lease_end(tmp_path: Path) -> None:
    async with _observed(tmp_path) as (hub, store, sessions):
        await sessions.create(CreateSessionInput(session_id="s1", lease_ttl_s=30))
        await sessions.create(CreateSessionInput(session_id="s2", lease_ttl_s=3600))
        warner = LeaseWarner(store, hub, warning_s=60)
        watch = hub.watch("default", 0, lambda e: e.kind == "LEASE_EXPIRING")
        assert await warner.check_once() == 1
        assert await warner.check_once() == 0  # once per lease end
        (warned,) = await _take(watch, 1)
        assert warned.session_id == "s1" and 0 < float(warned.attributes["expires_in_s"]) <= 30
        await sessions.renew("s1", 40)  # a new end: a new warning
        assert await warner.check_once() == 1
        await watch.aclose()


def test_docker_stats_document_to_stats() -> None:
    from sandboxd.engine.docker_stats import stats_from

    doc = {
        "cpu_stats": {
            "cpu_usage": {"total_usage": 2_500_000_000},
            "throttling_data": {"throttled_time": 1_000_000_000},
        },
        "memory_stats": {"usage": 1000, "max_usage": 5000},
        "pids_stats": {"current": 3},
        "networks": {"eth0": {"rx_bytes": 10, "tx_bytes": 5}, "eth1": {"rx_bytes": 1}},
    }
    s = stats_from(doc)
    assert (s.cpu_seconds, s.memory_bytes, s.memory_peak_bytes) == (2.5, 1000, 5000)
    assert (s.processes, s.network_bytes, s.cpu_throttled_s) == (3, 16, 1.0)
    assert stats_from({}) == type(s)()  # cgroup v2 / a stopped container: zeros, no error


async def test_stats_reader_and_cpu_throttling_between_readings(tmp_path: Path) -> None:
    from sandboxd.engine.protocol import SandboxStats
    from sandboxd.events.stats import StatsReader

    async with _observed(tmp_path) as (hub, store, sessions):
        s = await sessions.create(CreateSessionInput(session_id="s1"))
        engine = sessions._engine  # type: ignore[attr-defined]
        commands = sessions._commands  # type: ignore[attr-defined]
        reader = StatsReader(engine, hub, lambda sid: {"s1": 40}.get(sid, 0), commands=commands)
        watch = hub.watch("default", 0, lambda e: e.kind == "CPU_THROTTLED")
        engine.set_stats(s.container_id, SandboxStats(cpu_seconds=1.0, memory_bytes=7))
        first = await reader.read(s)
        assert (first.cpu_seconds, first.memory_bytes) == (1.0, 7)
        assert first.egress_bytes == 40  # what the session's proxy moved
        await asyncio.sleep(0.2)
        engine.set_stats(s.container_id, SandboxStats(cpu_throttled_s=10.0))  # all the time
        await reader.read(s)
        (throttled,) = await _take(watch, 1)
        assert throttled.session_id == "s1" and float(throttled.attributes["throttled_share"]) > 1
        await sessions.suspend("s1")
        assert await reader.read(await sessions.get("s1")) == type(first)()  # no container
        await watch.aclose()
