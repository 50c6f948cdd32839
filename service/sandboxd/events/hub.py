"""The event hub: per-tenant sequence numbers, a bounded replay window, live fan-out.

Sequence numbers are per tenant. A server run starts them above every number an earlier run
can have handed out (the start time in microseconds), so a watcher reconnecting after a restart
with its last sequence is told `EVENTS_LOST` instead of silently missing what happened.
A watcher that does not keep up is never allowed to hold memory: its queue is bounded, and
when it overflows the watcher is told `EVENTS_LOST` and continues from the replay window.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

EVENTS_LOST = "EVENTS_LOST"
WINDOW = 1000  # events kept per tenant for replay
WATCH_QUEUE = 256  # live events a watcher may have unread before it is told it lost some


@dataclass(frozen=True)
class SessionEvent:
    sequence: int
    tenant: str
    session_id: str
    time: float
    kind: str  # a SessionEventKind name without its prefix: STATE_CHANGED, LEASE_EXPIRING...
    state: str = ""  # a SessionState name, "" when unknown or unchanged
    message: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)


Match = Callable[[SessionEvent], bool]


class _Watcher:
    def __init__(self, match: Match) -> None:
        self.match = match
        self.queue: asyncio.Queue[SessionEvent] = asyncio.Queue(WATCH_QUEUE)
        self.overflowed = False


class EventHub:
    def __init__(self, window: int = WINDOW, *, first_sequence: int | None = None) -> None:
        self._window = window
        self._first = first_sequence if first_sequence is not None else int(time.time() * 1e6)
        self._next: dict[str, int] = {}
        self._rings: dict[str, collections.deque[SessionEvent]] = {}
        self._watchers: dict[str, set[_Watcher]] = collections.defaultdict(set)
        self._labels: dict[str, dict[str, str]] = {}  # session -> labels, for selectors

    def labels_of(self, session_id: str) -> Mapping[str, str]:
        return self._labels.get(session_id, {})

    def note_labels(self, session_id: str, labels: Mapping[str, str]) -> None:
        self._labels[session_id] = dict(labels)

    def forget(self, session_id: str) -> None:
        self._labels.pop(session_id, None)

    def publish(
        self,
        tenant: str,
        session_id: str,
        kind: str,
        *,
        state: str = "",
        message: str = "",
        **attributes: object,
    ) -> SessionEvent:
        """Number, keep and fan out one event; never blocks (runs on the callers' paths)."""
        sequence = self._next.get(tenant, self._first)
        self._next[tenant] = sequence + 1
        event = SessionEvent(
            sequence=sequence,
            tenant=tenant,
            session_id=session_id,
            time=time.time(),
            kind=kind,
            state=state,
            message=message,
            attributes={k: str(v) for k, v in attributes.items() if v is not None},
        )
        ring = self._rings.get(tenant)
        if ring is None:
            ring = self._rings[tenant] = collections.deque(maxlen=self._window)
        ring.append(event)
        for watcher in self._watchers.get(tenant, ()):
            if watcher.overflowed or not watcher.match(event):
                continue
            try:
                watcher.queue.put_nowait(event)
            except asyncio.QueueFull:
                watcher.overflowed = True
        return event

    def _lost(self, tenant: str, session_id: str, after: int, upto: int) -> SessionEvent:
        return SessionEvent(
            sequence=upto - 1,
            tenant=tenant,
            session_id=session_id,
            time=time.time(),
            kind=EVENTS_LOST,
            message="events after the given sequence are no longer kept",
            attributes={"from_sequence": str(after + 1), "to_sequence": str(upto - 1)},
        )

    def _replay(self, tenant: str, after: int, match: Match, session_id: str) -> list[SessionEvent]:
        ring = self._rings.get(tenant, ())
        oldest = ring[0].sequence if ring else self._next.get(tenant, self._first)
        out: list[SessionEvent] = []
        if after and after + 1 < oldest:
            out.append(self._lost(tenant, session_id, after, oldest))
        out += [e for e in ring if e.sequence > after and match(e)]
        return out

    async def watch(
        self, tenant: str, after: int, match: Match, session_id: str = ""
    ) -> AsyncIterator[SessionEvent]:
        """The kept events after `after` (or EVENTS_LOST first), then live ones, forever."""
        watcher = _Watcher(match)
        self._watchers[tenant].add(watcher)
        try:
            last = after
            pending = self._replay(tenant, after, match, session_id)
            while True:
                for event in pending:
                    if event.kind == EVENTS_LOST or event.sequence > last:
                        last = max(last, event.sequence)
                        yield event
                if watcher.overflowed:
                    # Fell behind: drop the queue, say what is gone, go on from the window.
                    while not watcher.queue.empty():
                        watcher.queue.get_nowait()
                    watcher.overflowed = False
                    pending = self._replay(tenant, last, match, session_id)
                    continue
                pending = [await watcher.queue.get()]
        finally:
            self._watchers[tenant].discard(watcher)
            if not self._watchers[tenant]:
                del self._watchers[tenant]
