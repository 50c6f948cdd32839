"""The session event feed's subscription to the domain's events.

One producer per feed event: PROCESS_STARTED and PROCESS_EXITED come from the process manager's
`CommandStarted` and `CommandExited` whichever call ran the command (a background process's
STARTED is emitted before anything of it is read, so its EXITED never comes first), and
EGRESS_REFUSED from the proxy's `EgressDecided`. State changes and lease renewals are the
session store's (observed_store.py).
"""

from __future__ import annotations

from sandboxd import domain_events as de
from sandboxd.events.hub import EventHub

RUN = "run"  # ProcessOrigin.RUN: one call, one answer; its feed tells only the exit


class FeedSubscriber:
    def __init__(self, hub: EventHub) -> None:
        self._hub = hub

    def __call__(self, event: de.DomainEvent) -> None:
        if isinstance(event, de.CommandStarted):
            if event.origin != RUN:
                self._hub.publish(
                    event.tenant,
                    event.session_id,
                    "PROCESS_STARTED",
                    process_id=event.process_id,
                    argv=list(event.argv),
                )
        elif isinstance(event, de.CommandExited):
            self._hub.publish(
                event.tenant,
                event.session_id,
                "PROCESS_EXITED",
                process_id=event.process_id,
                exit_code=event.exit_code,
                signal=event.signal or None,
                timed_out=event.timed_out,
            )
        elif isinstance(event, de.EgressDecided):
            if not event.allowed and event.kind == "egress":
                self._hub.publish(
                    event.tenant,
                    event.session_id,
                    "EGRESS_REFUSED",
                    message=f"{event.host or '-'}:{event.port} {event.reason}",
                    host=event.host,
                    port=event.port,
                    rule=event.reason,
                )
