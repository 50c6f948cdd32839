"""Audit events in their own SQLite database file (WAL), apart from the session records.

A database of its own so the audit writer's commits never wait on (or hold) the session
store's lock; aiosqlite keeps disk I/O off the event loop. WAL with synchronous=NORMAL: a
committed transaction survives the process being killed (it is in the OS's page cache and the
WAL); only a power loss may drop the last commits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Sequence
from functools import cache

from sandboxd.audit.events import AuditEvent, AuditQuery
from sandboxd.schema import statements
from sandboxd.sqlite_file import SqliteFile, commit

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    attributes TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_tenant ON audit_events (tenant, id);
CREATE INDEX IF NOT EXISTS audit_time ON audit_events (time);
"""


_ROW = "(?, ?, ?, ?, ?, ?, ?)"


@cache
def _insert(count: int) -> str:
    """The INSERT of `count` rows (at most the writer's batch: 7 variables a row stay far
    below SQLite's 32766), made once per count."""
    return (
        "INSERT INTO audit_events (time, tenant, session_id, kind, attributes, trace_id, size)"
        f" VALUES {', '.join([_ROW] * count)} RETURNING id"
    )


class AuditStore(SqliteFile):
    PART = "audit_events"
    STEPS = (statements(_SCHEMA),)  # 0.1.0
    ROWS_BY_NAME = False
    # A batch is one multi-row INSERT: in autocommit it is a transaction of its own, which
    # SQLite commits as the statement ends (all its rows or none), so a batch takes one round
    # trip to the database thread, where Python's implicit BEGIN needed a commit of its own.
    AUTOCOMMIT = True

    async def append(self, events: Sequence[AuditEvent]) -> list[AuditEvent]:
        """Write a batch in one transaction; the events with their ids once it is committed.

        One round trip to the database thread whatever the batch's size (once an INSERT, a
        last-id read and a commit; before that one INSERT per event): the rows in one
        statement, which commits as it ends (autocommit) and returns the ids it gave them."""
        if not events:
            return []
        rows: list[object] = []
        for e in events:
            attrs = json.dumps(dict(e.attributes), separators=(",", ":"))
            size = len(attrs) + len(e.session_id) + len(e.tenant) + len(e.trace_id) + 48
            rows += (e.time, e.tenant, e.session_id, e.kind, attrs, e.trace_id, size)
        try:
            ids = await self.db.execute_fetchall(_insert(len(events)), rows)
        except BaseException:
            with contextlib.suppress(Exception):  # the write's own failure is the one told
                await self.db.rollback()  # nothing of a failed batch rides on a later commit
            raise
        # RETURNING gives no order; AUTOINCREMENT gave the rows increasing ids in order.
        given = sorted(int(row[0]) for row in ids)
        return [dataclasses.replace(e, id=given[i]) for i, e in enumerate(events)]

    async def list(self, query: AuditQuery) -> list[AuditEvent]:
        """Events of one tenant matching the query, by id, after `after_id`, at most `limit`."""
        where = ["tenant = ?", "id > ?"]
        args: list[object] = [query.tenant, query.after_id]
        if query.session_id:
            where.append("session_id = ?")
            args.append(query.session_id)
        if query.kinds:
            kinds = sorted(query.kinds)
            where.append(f"kind IN ({','.join('?' * len(kinds))})")
            args.extend(kinds)
        if query.start_time is not None:
            where.append("time >= ?")
            args.append(query.start_time)
        if query.end_time is not None:
            where.append("time < ?")
            args.append(query.end_time)
        sql = (
            "SELECT id, time, tenant, session_id, kind, attributes, trace_id FROM audit_events"
            f" WHERE {' AND '.join(where)} ORDER BY id LIMIT ?"
        )
        args.append(query.limit)
        async with self.db.execute(sql, args) as cursor:
            rows = await cursor.fetchall()
        return [
            AuditEvent(
                time=r[1],
                tenant=r[2],
                session_id=r[3],
                kind=r[4],
                attributes=json.loads(r[5]),
                trace_id=r[6],
                id=r[0],
            )
            for r in rows
        ]

    async def prune(self, *, older_than: float, max_bytes: int) -> int:
        """Drop events older than `older_than`, then the oldest until the rest fit `max_bytes`."""
        cursor = await self.db.execute("DELETE FROM audit_events WHERE time < ?", (older_than,))
        removed = max(cursor.rowcount, 0)
        async with self.db.execute("SELECT COALESCE(SUM(size), 0) FROM audit_events") as c:
            row = await c.fetchone()
        total = int(row[0]) if row else 0
        if total > max_bytes:
            # The newest events whose running total fits stay; everything older goes.
            async with self.db.execute(
                "SELECT id FROM (SELECT id, SUM(size) OVER (ORDER BY id DESC) AS kept"
                " FROM audit_events) WHERE kept > ? ORDER BY id DESC LIMIT 1",
                (max_bytes,),
            ) as c:
                cut = await c.fetchone()
            if cut is not None:
                cursor = await self.db.execute("DELETE FROM audit_events WHERE id <= ?", (cut[0],))
                removed += max(cursor.rowcount, 0)
        await commit(self.db)
        return removed
