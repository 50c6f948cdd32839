"""GetSessionStats, WatchSession and WatchSessions: the session RPCs over the domain's
EventHub and StatsReader.

Proto <-> domain only; domain errors are mapped by the servicer (`session_service.py`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping

from sandboxd import tenancy
from sandboxd.api.pb_time import time_pb
from sandboxd.errors import InvalidArgument
from sandboxd.events import EventHub, SessionEvent
from sandboxd.events.stats import StatsReader
from sandboxd.reasons import Reason
from sandboxd.sessions import SessionManager
from sandboxd.v1 import events_pb2


def event_pb(e: SessionEvent) -> events_pb2.SessionEvent:
    return events_pb2.SessionEvent(
        sequence=e.sequence,
        session_id=e.session_id,
        time=time_pb(e.time),
        kind=events_pb2.SessionEventKind.Value(f"SESSION_EVENT_KIND_{e.kind}"),
        state=e.state,
        message=e.message,
        attributes=dict(e.attributes),
    )


def _after(value: int) -> int:
    if value < 0:
        raise InvalidArgument("after_sequence must not be negative", reason=Reason.INVALID_SEQUENCE)
    return value


def _ends_session(e: SessionEvent) -> bool:
    return e.kind == "STATE_CHANGED" and e.attributes.get("deleted") == "true"


class SessionEventRpcs:
    def __init__(self, sessions: SessionManager, hub: EventHub, stats: StatsReader) -> None:
        self._sessions = sessions
        self._hub = hub
        self._stats = stats

    async def GetSessionStats(
        self, request: events_pb2.GetSessionStatsRequest
    ) -> events_pb2.GetSessionStatsResponse:
        session = await self._sessions.get(request.session_id)
        s = await self._stats.read(session)
        return events_pb2.GetSessionStatsResponse(
            stats=events_pb2.SessionStats(
                cpu_seconds=s.cpu_seconds,
                memory_bytes=s.memory_bytes,
                memory_peak_bytes=s.memory_peak_bytes,
                workspace_bytes=s.workspace_bytes,
                processes=s.processes,
                egress_bytes=s.egress_bytes,
            )
        )

    async def WatchSession(
        self, request: events_pb2.WatchSessionRequest
    ) -> AsyncGenerator[events_pb2.WatchSessionResponse, None]:
        after = _after(request.after_sequence)
        session = await self._sessions.get(request.session_id)  # NOT_FOUND: missing or theirs
        sid = session.session_id
        self._hub.note_labels(sid, session.labels)
        async for e in self._hub.watch(
            session.tenant, after, lambda e: e.session_id == sid, session_id=sid
        ):
            yield events_pb2.WatchSessionResponse(event=event_pb(e))
            if _ends_session(e):
                return  # a deleted session has nothing more to say

    async def WatchSessions(
        self, request: events_pb2.WatchSessionsRequest
    ) -> AsyncGenerator[events_pb2.WatchSessionsResponse, None]:
        after = _after(request.after_sequence)
        selector: Mapping[str, str] = dict(request.label_selector)
        labels_of = self._hub.labels_of
        if selector:  # sessions from before this server run: their labels, known up front
            token = ""
            while True:
                sessions, token = await self._sessions.list_sessions(dict(selector), 0, token)
                for s in sessions:
                    self._hub.note_labels(s.session_id, s.labels)
                if not token:
                    break

        def match(e: SessionEvent) -> bool:
            if not selector:
                return True
            labels = labels_of(e.session_id)
            return all(labels.get(k) == v for k, v in selector.items())

        async for e in self._hub.watch(tenancy.current(), after, match):
            yield events_pb2.WatchSessionsResponse(event=event_pb(e))


__all__ = ["SessionEventRpcs", "event_pb"]
