"""Schema versions of the server's SQLite data, and the ordered steps that bring older data up.

Each part of the data (the sessions table, snapshots, templates, ...) has a list of steps; its
version is how many of them a file has had, kept in the file's `schema_versions` table. At
start-up every part runs the steps it has not had yet, in order, in the same transaction as its
version's update, so a server killed during an upgrade starts the upgrade again and never sees
half of one. Step 1 of every part is the schema of release 0.1.0, the first to carry versions:
data of that release has no `schema_versions` row and its step 1 is written to be a no-op on it
(CREATE ... IF NOT EXISTS, a column added only when missing). A later change to a table is a new
step at the end of its list, never an edit of an old one.

Data written by a newer server (a version above the steps this server knows) is refused at
start-up: an older server must not guess at columns it has never seen. The data directory's
layout, backup and restore are in docs/operations.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import aiosqlite

from sandboxd.errors import ConfigError

Step = Callable[[aiosqlite.Connection], Awaitable[None]]

_VERSIONS = """CREATE TABLE IF NOT EXISTS schema_versions (
    part TEXT PRIMARY KEY,
    version INTEGER NOT NULL
)"""


def statements(script: str) -> Step:
    """A step of plain SQL statements separated by `;` (none may contain one in a literal).

    Run one by one with `execute`: `executescript` would commit, and a step must commit with
    its version or not at all."""
    parts = [s.strip() for s in script.split(";") if s.strip()]

    async def run(db: aiosqlite.Connection) -> None:
        for statement in parts:
            await db.execute(statement)

    return run


def add_column(table: str, column: str, definition: str) -> Step:
    """`ALTER TABLE ... ADD COLUMN` unless the column is there (step 1 meets 0.1.0 data)."""

    async def run(db: aiosqlite.Connection) -> None:
        columns = {row[1] for row in await db.execute_fetchall(f"PRAGMA table_info({table})")}
        if column not in columns:
            await db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")

    return run


def steps_of(*parts: Step) -> Step:
    """Several steps run as one (one version number)."""

    async def run(db: aiosqlite.Connection) -> None:
        for part in parts:
            await part(db)

    return run


async def version_of(db: aiosqlite.Connection, part: str) -> int:
    await db.execute(_VERSIONS)
    async with db.execute("SELECT version FROM schema_versions WHERE part = ?", (part,)) as cur:
        row = await cur.fetchone()
    return int(row[0]) if row is not None else 0


async def migrate(db: aiosqlite.Connection, part: str, steps: Sequence[Step]) -> int:
    """Run the steps `part` has not had; its version after. The caller commits."""
    version = await version_of(db, part)
    if version > len(steps):
        raise ConfigError(
            f"data_dir: the {part} data is at schema version {version}, newer than this "
            f"server's {len(steps)}: a newer sandboxd wrote it; run that version, or restore "
            "the backup taken before the upgrade (docs/operations.md)"
        )
    if version < len(steps) and not db.in_transaction:
        # Python's sqlite3 opens a transaction only before INSERT/UPDATE/DELETE: a step's
        # CREATE or ALTER would commit on its own, apart from the version that records it.
        await db.execute("BEGIN")
    for number in range(version, len(steps)):
        await steps[number](db)
    if version < len(steps):
        await db.execute(
            "INSERT INTO schema_versions (part, version) VALUES (?, ?)"
            " ON CONFLICT(part) DO UPDATE SET version = excluded.version",
            (part, len(steps)),
        )
    return len(steps)
