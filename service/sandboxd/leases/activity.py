"""Lease renewal on activity: a session whose terms ask for it (`renew_on_activity`) has its
lease renewed by the default length whenever a caller runs a command in it.

A subscriber of the domain's command events, so every way of running a command counts the
same (Exec, Run, Interact, StartProcess) and no RPC name is listed. The renewal is part of the
call that ran the command (deferred to its scope): the caller that sees its answer sees the new
lease. Reads never renew; a background process's exit long after its call does not either.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from sandboxd import domain_events as de
from sandboxd.errors import SandboxError

log = logging.getLogger(__name__)

Renew = Callable[[str], Awaitable[None]]  # session id -> renew if its terms ask


class ActivityRenewal:
    def __init__(self, renew: Renew) -> None:
        self._renew = renew

    def __call__(self, event: de.DomainEvent) -> None:
        # Once per command, when its call has its outcome: a background process's start
        # (StartProcess answers then), any other command's exit.
        ran = isinstance(event, de.CommandStarted) and event.background
        ended = isinstance(event, de.CommandExited) and not event.background
        if not (ran or ended):
            return
        assert isinstance(event, de.CommandStarted | de.CommandExited)
        scope = de.current_call()
        if scope is None or not event.session_id:
            return
        scope.defer(self._best_effort(event.session_id))

    async def _best_effort(self, session_id: str) -> None:
        try:
            await self._renew(session_id)
        except SandboxError as exc:  # the command's answer stands; the renewal is best effort
            log.info("renew on activity: %s", exc.message)
