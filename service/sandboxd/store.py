"""Session records in an embedded SQLite database, so a restarted server knows its sessions.

aiosqlite runs SQLite in its own thread: the event loop never blocks on disk.

The server is the records' only writer, so a record read once is kept in memory and served from
there (every command reads its session: a thread round trip and a spec decoded per call, before).
The database stays the truth: every write goes to it first and reaches the memory copy only
after its commit returned (a failed write drops the copy, so the next read is the database's
word); a read that raced a write never stores what it read; a restart starts with nothing in
memory. What a read returns is a copy: a caller that changes it and never writes it changes
nothing here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sandboxd.models import NetworkMode, Session, SessionState
from sandboxd.schema import add_column, statements, steps_of
from sandboxd.session_rows import (
    MAX_PAUSES,
    from_stamp,
    loss_from_json,
    loss_to_json,
    row_to_session,
    spec_to_json,
    suspension_to_json,
    to_stamp,
)
from sandboxd.sqlite_file import SqliteFile, commit

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    lease_expires_at REAL NOT NULL,
    container_id TEXT NOT NULL DEFAULT '',
    labels TEXT NOT NULL,
    spec TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_lease ON sessions (lease_expires_at);
"""


@dataclass(frozen=True)
class SessionRow:
    """A record without its spec: what reconcile needs of every session, cheap to read."""

    session_id: str
    state: SessionState
    container_id: str


def _copy(s: Session) -> Session:
    """A copy a caller may change: its own labels (the spec and the loss are frozen)."""
    return dataclasses.replace(s, labels=dict(s.labels))


class SessionStore(SqliteFile):
    PART = "sessions"
    STEPS = (
        # 0.1.0: the table, and tenants (every session of a database from before them is
        # "default"'s).
        steps_of(
            statements(_SCHEMA),
            add_column("sessions", "tenant", "TEXT NOT NULL DEFAULT 'default'"),
            statements("CREATE INDEX IF NOT EXISTS sessions_tenant ON sessions (tenant, state)"),
        ),
        # What a dead sandbox lost (models.Loss): none said so before.
        add_column("sessions", "loss", "TEXT NOT NULL DEFAULT ''"),
        # What a suspension kept and the memory suspends it came back from (models.SuspendMode,
        # pauses): before memory suspends, the filesystem and none.
        add_column("sessions", "suspension", "TEXT NOT NULL DEFAULT ''"),
    )

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._cache: dict[str, Session] = {}  # committed records only (the module's docstring)
        self._writes = 0  # writes begun: a read that saw this change under it caches nothing

    @asynccontextmanager
    async def _writing(self, session_id: str) -> AsyncIterator[Callable[[Session], None]]:
        """Around one write of a record: its memory copy is dropped first and on any failure
        (a cancelled or failed write leaves the database's word, whatever it is, as the only
        one). The body calls what this yields with the record as committed, after its commit;
        it is kept only if no other write began meanwhile (theirs may have committed later)."""
        self._writes += 1
        mine = self._writes
        self._cache.pop(session_id, None)

        def committed(record: Session) -> None:
            if self._writes == mine:
                self._cache[session_id] = _copy(record)

        try:
            yield committed
        except BaseException:
            self._cache.pop(session_id, None)
            raise

    async def insert(self, s: Session) -> None:
        async with self._writing(s.session_id):
            await self._insert(s)
            # Not kept: the first read keeps the record as stored (timestamps as the database
            # rounds them), so a copy from memory never differs from one read after a restart.

    async def _insert(self, s: Session) -> None:
        await self.db.execute(
            "INSERT INTO sessions (session_id, fingerprint, state, created_at, lease_expires_at,"
            " container_id, labels, spec, tenant) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                s.session_id,
                s.fingerprint,
                s.state.value,
                to_stamp(s.created_at),
                to_stamp(s.lease_expires_at),
                s.container_id,
                json.dumps(s.labels),
                spec_to_json(s.spec),
                s.tenant,
            ),
        )
        await commit(self.db)

    async def update(self, s: Session) -> None:
        """Persist the mutable fields (state, lease, container, loss, suspend mode, pauses)."""
        before = self._cache.get(s.session_id)
        async with self._writing(s.session_id) as committed:
            await self._update(s)
            if before is not None:  # only what the write persisted; the rest as stored
                committed(
                    dataclasses.replace(
                        before,
                        state=s.state,
                        lease_expires_at=from_stamp(to_stamp(s.lease_expires_at)),  # as stored
                        container_id=s.container_id,
                        loss=loss_from_json(loss_to_json(s.loss)),
                        suspend_mode=s.suspend_mode,
                        pauses=tuple(s.pauses[-MAX_PAUSES:]),
                    )
                )

    async def _update(self, s: Session) -> None:
        await self.db.execute(
            "UPDATE sessions SET state = ?, lease_expires_at = ?, container_id = ?, loss = ?,"
            " suspension = ? WHERE session_id = ?",
            (
                s.state.value,
                to_stamp(s.lease_expires_at),
                s.container_id,
                loss_to_json(s.loss),
                suspension_to_json(s),
                s.session_id,
            ),
        )
        await commit(self.db)

    async def update_spec(self, s: Session) -> None:
        """Persist a changed spec and its fingerprint (UpdateNetworkPolicy)."""
        async with self._writing(s.session_id):
            await self.db.execute(
                "UPDATE sessions SET spec = ?, fingerprint = ? WHERE session_id = ?",
                (spec_to_json(s.spec), s.fingerprint, s.session_id),
            )
            await commit(self.db)
            # Dropped, not refilled: a rare write, and the next read decodes what was stored.

    async def get(self, session_id: str) -> Session | None:
        cached = self._cache.get(session_id)
        if cached is not None:
            return _copy(cached)
        writes = self._writes
        stored = await self._read(session_id)
        if stored is None:
            return None
        if writes == self._writes:  # no write began while this read was on the way
            self._cache[session_id] = stored
        return _copy(stored)

    async def _read(self, session_id: str) -> Session | None:
        async with self.db.execute(
            "SELECT * FROM sessions WHERE session_id = ?", (session_id,)
        ) as cur:
            row = await cur.fetchone()
        return row_to_session(row) if row else None

    async def delete(self, session_id: str) -> None:
        async with self._writing(session_id):
            await self.db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            await commit(self.db)

    async def page(
        self,
        *,
        after: str,
        limit: int,
        labels: Mapping[str, str] | None = None,
        tenant: str | None = None,
        state: str | None = None,
    ) -> list[Session]:
        """Sessions ordered by id, after the given id; label, tenant and state filters in SQL."""
        sql = "SELECT * FROM sessions WHERE session_id > ?"
        params: list[Any] = [after]
        if state is not None:
            sql += " AND state = ?"
            params.append(state)
        if tenant is not None:
            sql += " AND tenant = ?"
            params.append(tenant)
        for key, value in (labels or {}).items():
            sql += " AND json_extract(labels, ?) = ?"
            params += [f'$."{key}"', value]
        sql += " ORDER BY session_id LIMIT ?"
        params.append(limit)
        rows = await self.db.execute_fetchall(sql, params)
        return [row_to_session(r) for r in rows]

    async def tenant_usage(self, tenant: str, live_states: tuple[str, ...]) -> tuple[int, int]:
        """(sessions, memory bytes) a tenant holds in the given states, for its quotas."""
        marks = ", ".join("?" for _ in live_states)
        async with self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(json_extract(spec, '$.limits.memory_bytes')), 0)"
            f" FROM sessions WHERE tenant = ? AND state IN ({marks})",
            (tenant, *live_states),
        ) as cur:
            row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    async def volume_users(
        self, tenant: str, volume_id: str, live_states: tuple[str, ...]
    ) -> list[tuple[str, bool]]:
        """(session id, read-only) of the tenant's sessions in `live_states` that mount the
        volume: read from the records themselves, so no second list of mounts can drift from
        what the sandboxes were made with (a create, a delete, an expiry or a failed create
        each change only the record)."""
        marks = ", ".join("?" for _ in live_states)
        rows = await self.db.execute_fetchall(
            "SELECT s.session_id, json_extract(v.value, '$.read_only')"
            " FROM sessions s, json_each(s.spec, '$.volumes') v"
            f" WHERE s.tenant = ? AND s.state IN ({marks})"
            " AND json_extract(v.value, '$.volume_id') = ? ORDER BY s.session_id",
            (tenant, *live_states, volume_id),
        )
        return [(str(r[0]), bool(r[1])) for r in rows]

    async def disk_ids(self, states: tuple[SessionState, ...]) -> set[str]:
        """The disk workspaces the records in `states` name (the sweep keeps those)."""
        marks = ", ".join("?" for _ in states)
        rows = await self.db.execute_fetchall(
            "SELECT json_extract(spec, '$.disk_id') FROM sessions"
            f" WHERE state IN ({marks}) AND json_extract(spec, '$.disk_id') != ''",
            tuple(s.value for s in states),
        )
        return {str(r[0]) for r in rows if r[0]}

    async def host_ids_between(self, first: int, last: int) -> set[int]:
        """Every uid or gid in [first, last] a record holds, whatever its state: an id stays
        taken until its record is deleted (DeleteSession, or pruned an hour after it ended)."""
        rows = await self.db.execute_fetchall(
            "SELECT json_extract(spec, '$.uid'), json_extract(spec, '$.gid') FROM sessions"
        )
        return {int(v) for row in rows for v in row if v is not None and first <= int(v) <= last}

    async def count_by_state(self) -> dict[str, int]:
        """How many sessions are in each state (metrics; reads no specs)."""
        rows = await self.db.execute_fetchall("SELECT state, COUNT(*) FROM sessions GROUP BY state")
        return {str(row[0]): int(row[1]) for row in rows}

    async def all(self) -> list[Session]:
        rows = await self.db.execute_fetchall("SELECT * FROM sessions ORDER BY session_id")
        return [row_to_session(r) for r in rows]

    async def index(self) -> list[SessionRow]:
        """Every record's id, state and container id (no spec is decoded)."""
        rows = await self.db.execute_fetchall(
            "SELECT session_id, state, container_id FROM sessions ORDER BY session_id"
        )
        return [SessionRow(r[0], SessionState(r[1]), r[2]) for r in rows]

    async def allowlist_ids(self) -> list[str]:
        """Ids of the records whose network policy is ALLOWLIST (an egress proxy's sessions),
        in any state: what the egress reconcile looks at besides the proxies it holds."""
        rows = await self.db.execute_fetchall(
            "SELECT session_id FROM sessions"
            " WHERE json_extract(spec, '$.network.mode') = ? ORDER BY session_id",
            (NetworkMode.ALLOWLIST.value,),
        )
        return [str(r[0]) for r in rows]

    async def due_for_expiry(self, now: datetime) -> list[str]:
        """Ids of the sessions whose lease ended and that are not EXPIRED yet (indexed)."""
        rows = await self.db.execute_fetchall(
            "SELECT session_id FROM sessions WHERE lease_expires_at <= ? AND state != ?",
            (to_stamp(now), SessionState.EXPIRED.value),
        )
        return [str(r[0]) for r in rows]

    async def ended_before(self, before: datetime) -> list[str]:
        """Ids of EXPIRED or FAILED sessions whose lease ended before `before` (indexed)."""
        rows = await self.db.execute_fetchall(
            "SELECT session_id FROM sessions WHERE lease_expires_at <= ? AND state IN (?, ?)",
            (to_stamp(before), SessionState.EXPIRED.value, SessionState.FAILED.value),
        )
        return [str(r[0]) for r in rows]
