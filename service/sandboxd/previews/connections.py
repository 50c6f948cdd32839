"""Open preview connections: counted and metered per session, and cut when their preview goes.

The per-session limits follow the quota model of `tenancy.TenantSlots` (checked and counted
with no await between, 0 = no cap): `preview_max_connections` open connections and
`preview_max_bytes` relayed bytes per session. A connection is registered with the port and
publication generation it was opened under, so UnpublishPort, a new PublishPort (which revokes
older tokens) and the session's end cut exactly the connections they concern, WebSocket
tunnels and endless event streams included.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field


class OverLimit(Exception):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@dataclass(eq=False)
class Connection:
    session_id: str
    port: int
    generation: int
    task: asyncio.Task[object] | None
    relayed: int = 0


@dataclass
class OpenConnections:
    max_connections: int = 0
    max_bytes: int = 0
    _open: dict[str, set[Connection]] = field(default_factory=dict)
    _bytes: collections.Counter[str] = field(default_factory=collections.Counter)

    def count(self, session_id: str) -> int:
        return len(self._open.get(session_id, ()))

    def relayed(self, session_id: str) -> int:
        return self._bytes[session_id]

    @contextlib.contextmanager
    def hold(self, session_id: str, port: int, generation: int) -> Iterator[Connection]:
        """One connection to the sandbox, for the block; OverLimit when the session is full."""
        if self.max_connections and self.count(session_id) >= self.max_connections:
            raise OverLimit(f"the session has {self.max_connections} open preview connections")
        self.check_bytes(session_id)
        conn = Connection(session_id, port, generation, asyncio.current_task())
        self._open.setdefault(session_id, set()).add(conn)
        try:
            yield conn
        finally:
            held = self._open.get(session_id)
            if held is not None:
                held.discard(conn)
                if not held:
                    del self._open[session_id]

    def check_bytes(self, session_id: str) -> None:
        if self.max_bytes and self._bytes[session_id] >= self.max_bytes:
            raise OverLimit(f"the session's previews relayed {self.max_bytes} bytes, its quota")

    def count_bytes(self, conn: Connection, n: int) -> None:
        """Meter `n` relayed bytes; OverLimit once the session is past its quota."""
        conn.relayed += n
        self._bytes[conn.session_id] += n
        self.check_bytes(conn.session_id)

    def cut(self, session_id: str, port: int | None = None, keep_generation: int = -1) -> int:
        """Cancel the session's connections (of `port` only, when given) except those opened
        under `keep_generation`; returns how many."""
        cut = 0
        for conn in list(self._open.get(session_id, ())):
            if port is not None and conn.port != port:
                continue
            if conn.generation == keep_generation or conn.task is None:
                continue
            conn.task.cancel()
            cut += 1
        return cut

    def forget(self, session_id: str) -> None:
        """The session ended: its byte count goes with it."""
        self._bytes.pop(session_id, None)
