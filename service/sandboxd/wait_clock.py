"""One timer for a task's repeated waits: the idle timeout of every message of a stream.

A stream waits once per message (the next output of a command, the client taking a reply).
`asyncio.timeout` around each wait made a timer, pushed it on the loop's heap and cancelled it
again, per message (about 5 us, and a getpid per `current_task`); on an interactive stream that
is per keystroke. A `WaitClock` is two stores per wait (`begin`, `end`) and one timer per
`idle` period: when it fires it cancels a wait that has lasted `idle` (or reached `deadline`),
or sets itself again for the wait under way; between waits it lapses, and the next wait sets it
again. Only a task waiting in a `begin`/`end` pair is ever cancelled, so the cancellation
always lands on that wait, never on the task's other work (a reply written between two reads
of the same task, under a clock of its own).
"""

from __future__ import annotations

import asyncio
import math


class WaitClock:
    """The waits of the current task, each at most `idle` seconds and none past `deadline` (the
    loop's time). After a CancelledError in a wait, `expired()` says whether this clock caused
    it (the wait timed out, or `fire` ended it) rather than a cancellation of the task."""

    def __init__(self, idle: float, deadline: float = math.inf) -> None:
        self.idle = idle
        self.deadline = deadline
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.since: float | None = None  # when the wait in progress began; None between waits
        self.handle: asyncio.TimerHandle | None = None
        self._fired = False

    def begin(self) -> None:
        """A wait begins now (the next await of the task is the wait). The task is taken
        again at each wait: a generator's reads may each run in a task of their own (Python
        3.11's `wait_for` makes one), and the clock must cancel the task that waits, never
        the one that made the clock (with the loop given, no getpid)."""
        self.task = asyncio.current_task(self.loop)
        self.since = now = self.loop.time()
        if self.handle is None:
            self.arm(self._until(now))

    def end(self) -> None:
        """The wait is over. A cancellation of this clock that the wait swallowed (it returned
        all the same) is taken back, as `asyncio.timeout` does."""
        self.since = None
        if self._fired:
            self.expired()

    def _until(self, since: float) -> float:
        return min(since + self.idle, self.deadline)

    def arm(self, when: float) -> None:
        if math.isfinite(when):
            self.handle = self.loop.call_at(when, self._due)

    def _due(self) -> None:
        self.handle = None
        if self.since is None:
            return  # between waits: the next wait sets the timer again
        when = self._until(self.since)
        if self.loop.time() < when:
            self.arm(when)
        else:
            self.fire()

    def fire(self) -> None:
        """End the wait in progress now (its task sees a CancelledError, `expired()` True); a
        no-op between waits."""
        if self.since is not None and not self._fired and self.task is not None:
            self._fired = True
            self.task.cancel()

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def expired(self) -> bool:
        """After a cancelled wait: True (and the cancellation taken back) when this clock
        cancelled it and nothing else asked for the task's cancellation too."""
        if not self._fired or self.task is None:
            return False
        self._fired = False
        return self.task.uncancel() == 0

    def past_deadline(self) -> bool:
        return self.loop.time() >= self.deadline
