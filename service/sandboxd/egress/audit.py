"""Egress audit: one structured log line per proxy decision, and a bounded per-session record.

The record is what the API reads back (ListEgressEvents); it is kept in memory, newest
`MAX_EVENTS` per session, and dropped with the session. The durable copy is the audit log:
every decision (not the tunnel ends) goes to `on_event`, the server's audit writer.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

log = logging.getLogger("sandboxd.egress.audit")

MAX_EVENTS = 1000


@dataclass(frozen=True)
class EgressEvent:
    """One decision of a session's proxy; `reason` is empty for an allowed request."""

    seq: int
    time: float
    session_id: str
    method: str
    host: str
    port: int
    allowed: bool
    reason: str
    address: str = ""
    bytes_up: int = 0
    bytes_down: int = 0
    duration_s: float = 0.0
    ended: str = ""  # how an allowed connection ended: closed, idle_timeout, lifetime, ...
    kind: str = "egress"  # or secret_injected / secret_misdirected (sandboxd.secrets)
    secret: str = ""  # the secret's name for the secret kinds (never its value)


# (tenant, event) -> None: must not block (it runs on the proxy's path).
EgressSink = Callable[[str, EgressEvent], None]


class AuditLog:
    """The bounded event record of one session."""

    def __init__(
        self,
        session_id: str,
        max_events: int = MAX_EVENTS,
        on_decision: Callable[[bool], None] | None = None,
        on_event: EgressSink | None = None,
        tenant: str = "",
        on_secret: Callable[[str], None] | None = None,
    ) -> None:
        self.session_id = session_id
        self.tenant = tenant
        self._on_event = on_event  # the durable audit log: decisions only
        self._on_decision = on_decision  # metrics: counts verdicts, not tunnel ends
        self._on_secret = on_secret  # metrics: counts secret events by kind
        self._events: collections.deque[EgressEvent] = collections.deque(maxlen=max_events)
        self._seq = 0

    def record(
        self,
        *,
        method: str,
        host: str,
        port: int,
        allowed: bool,
        reason: str = "",
        address: str = "",
        bytes_up: int = 0,
        bytes_down: int = 0,
        duration_s: float = 0.0,
        ended: str = "",
        kind: str = "egress",
        secret: str = "",
    ) -> EgressEvent:
        self._seq += 1
        event = EgressEvent(
            seq=self._seq,
            time=time.time(),
            session_id=self.session_id,
            method=method,
            host=host[:300],
            port=port,
            allowed=allowed,
            reason=reason,
            address=address,
            bytes_up=bytes_up,
            bytes_down=bytes_down,
            duration_s=round(duration_s, 3),
            ended=ended,
            kind=kind,
            secret=secret[:128],
        )
        self._events.append(event)
        if kind != "egress":
            if self._on_secret is not None:
                self._on_secret(kind)
        elif self._on_decision is not None and not ended:
            self._on_decision(allowed)
        if self._on_event is not None and not ended:
            self._on_event(self.tenant, event)
        verdict = "ALLOWED" if allowed else "REFUSED"
        # One line per decision; with the JSON log format every field is its own key.
        extra = {f"egress_{k}": v for k, v in asdict(event).items() if k not in ("time",)}
        extra["session_id"] = extra.pop("egress_session_id")
        extra["egress_verdict"] = verdict
        log.info(
            "egress %s %s %s:%d %s",
            verdict,
            method or "-",
            event.host or "-",
            port,
            reason or ended or (f"{kind} {secret}" if secret else ""),
            extra=extra,
        )
        return event

    def events(self, after_seq: int = 0, limit: int = 100) -> list[EgressEvent]:
        """Events with seq > after_seq, oldest first, at most `limit`."""
        return [e for e in self._events if e.seq > after_seq][:limit]
