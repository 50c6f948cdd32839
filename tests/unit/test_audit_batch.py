"""A batch of audit events is written in one statement: each event's answered id is the id
its row got, and a batch that failed leaves no row behind for the next commit to keep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sandboxd.audit import AuditEvent
from sandboxd.audit.events import AuditQuery
from sandboxd.audit.store import AuditStore


def _event(n: int, tenant: str = "alpha") -> AuditEvent:
    return AuditEvent.of("command", time=1000.0 + n, tenant=tenant, session_id=f"s-{n}", n=n)


async def test_each_event_gets_the_id_of_its_row(tmp_path: Path) -> None:
    async with AuditStore(tmp_path / "audit.db") as store:
        answered = await store.append([_event(i) for i in range(3)])
        answered += await store.append([_event(i, "beta") for i in range(3, 7)])
        answered += await store.append([_event(7)])
        assert await store.append([]) == []
        stored = await store.list(AuditQuery(tenant="alpha", limit=100))
        stored += await store.list(AuditQuery(tenant="beta", limit=100))
    by_id = {e.id: e for e in stored}
    assert len(by_id) == len(answered) == 8
    for event in answered:
        row = by_id[event.id]
        assert (row.session_id, row.tenant, row.attributes) == (
            event.session_id,
            event.tenant,
            event.attributes,
        )


async def test_a_failed_batch_leaves_no_row(tmp_path: Path) -> None:
    async with AuditStore(tmp_path / "audit.db") as store:
        real = store._db
        assert real is not None

        class FailingLastId:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            async def execute_fetchall(self, *args: Any) -> Any:
                raise OSError("disk I/O error")  # after the rows were inserted

        store._db = FailingLastId()  # type: ignore[assignment]
        with pytest.raises(OSError):
            await store.append([_event(1), _event(2)])
        store._db = real
        await store.append([_event(3)])  # the next batch's commit
        stored = await store.list(AuditQuery(tenant="alpha", limit=100))
    assert [e.session_id for e in stored] == ["s-3"]


async def test_a_batch_whose_last_row_fails_leaves_none_of_its_rows(tmp_path: Path) -> None:
    """The batch is one statement: a row refused after others were inserted takes them all
    back, and the store goes on with the next batch."""
    import sqlite3

    bad = AuditEvent.of("command", time=None, tenant="alpha", session_id="s-bad")  # type: ignore[arg-type]
    async with AuditStore(tmp_path / "audit.db") as store:
        with pytest.raises(sqlite3.IntegrityError):
            await store.append([_event(1), _event(2), bad])
        answered = await store.append([_event(3)])
        stored = await store.list(AuditQuery(tenant="alpha", limit=100))
    assert [e.session_id for e in stored] == ["s-3"]
    assert [e.id for e in answered] == [e.id for e in stored]
