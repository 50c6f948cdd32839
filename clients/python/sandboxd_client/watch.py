"""Session events and stats (WatchSession, WatchSessions, GetSessionStats):
`SandboxClient.watch_session` / `watch_sessions` / `get_session_stats` and their result types.
A mixin of `SandboxClient`."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

from sandboxd_client._convert import timestamp
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import UNSET, rpc
from sandboxd_client._session_calls import SessionCalls

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import events_pb2
else:  # loaded on first use (sandboxd_client._lazy)
    events_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.events_pb2")


@dataclass(frozen=True)
class SessionEvent:
    """One session event. `kind` is the SessionEventKind name without its prefix
    ("STATE_CHANGED", "LEASE_EXPIRING", "PROCESS_EXITED", "EVENTS_LOST"...); `sequence` is
    what to pass as `after_sequence` when reconnecting."""

    sequence: int
    session_id: str
    time: dt.datetime | None
    kind: str
    state: str = ""
    message: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_pb(cls, msg: Any) -> Self:
        return cls(
            sequence=msg.sequence,
            session_id=msg.session_id,
            time=timestamp(msg, "time"),
            kind=events_pb2.SessionEventKind.Name(msg.kind).removeprefix("SESSION_EVENT_KIND_"),
            state=msg.state.removeprefix("SESSION_STATE_"),
            message=msg.message,
            attributes=dict(msg.attributes),
        )


@dataclass(frozen=True)
class SessionStats:
    """One reading of a session's resource use (zeros while it has no container)."""

    cpu_seconds: float = 0.0
    memory_bytes: int = 0
    memory_peak_bytes: int = 0
    workspace_bytes: int = 0
    processes: int = 0
    egress_bytes: int = 0

    @classmethod
    def from_pb(cls, msg: Any) -> Self:
        return cls(
            cpu_seconds=msg.cpu_seconds,
            memory_bytes=msg.memory_bytes,
            memory_peak_bytes=msg.memory_peak_bytes,
            workspace_bytes=msg.workspace_bytes,
            processes=msg.processes,
            egress_bytes=msg.egress_bytes,
        )


class WatchMixin(SessionCalls):
    """SessionService's event streams and stats, a mixin of SandboxClient."""

    @rpc("SessionService/GetSessionStats")
    async def get_session_stats(
        self, session_id: str, *, timeout: float | None = UNSET
    ) -> SessionStats:
        """CPU, memory (and its peak), workspace bytes, processes and egress bytes now."""
        req = events_pb2.GetSessionStatsRequest(session_id=session_id)
        resp = await self._session_unary("GetSessionStats", req, timeout)
        return SessionStats.from_pb(resp.stats)

    @rpc("SessionService/WatchSession")
    async def watch_session(
        self, session_id: str, *, after_sequence: int = 0, timeout: float | None = None
    ) -> AsyncIterator[SessionEvent]:
        """One session's kept events after `after_sequence`, then live ones (until deleted)."""
        req = events_pb2.WatchSessionRequest(session_id=session_id, after_sequence=after_sequence)
        async for event in self._session_stream("WatchSession", req, timeout, _event):
            yield event

    @rpc("SessionService/WatchSessions")
    async def watch_sessions(
        self,
        labels: Mapping[str, str] | None = None,
        *,
        after_sequence: int = 0,
        timeout: float | None = None,
    ) -> AsyncIterator[SessionEvent]:
        """Events of every session of the caller's tenant carrying all of `labels`."""
        req = events_pb2.WatchSessionsRequest(
            label_selector=dict(labels or {}), after_sequence=after_sequence
        )
        async for event in self._session_stream("WatchSessions", req, timeout, _event):
            yield event


def _event(resp: Any) -> SessionEvent:
    return SessionEvent.from_pb(resp.event)


__all__ = ["SessionEvent", "SessionStats", "WatchMixin"]
