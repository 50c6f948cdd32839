"""Fair shares of the one server between tenants: who is active, and what each may take.

The server is one asyncio loop: every call and every byte a sandbox's agent sends is work on
it, served first come, first served. A tenant with many calls in flight, or sessions whose
commands write as fast as they can, fills that queue, and another tenant's Run waits behind
all of it (a flood multiplied a bystander's Run p50 by 7 in an outside check). So while more
than one tenant is active, each one's share is bounded at the two places where its work enters
the loop:

- calls: each tenant has a token bucket of `calls_per_s` (burst `call_burst`); a call with no
  token is refused before any work (RESOURCE_EXHAUSTED, TENANT_RATE_LIMITED) with the time
  until the next token in its RetryInfo (`admit_call`, used by api/admission.py); refusals in a
  row, and refusals of one tenant held at the same time, are held longer and longer before
  they are answered (`RateLimited`);
- command output: each tenant has a byte bucket of `output_bytes_per_s` (burst
  `output_burst_bytes`) that its sessions' agent channels spend as they read; a channel whose
  tenant is in debt waits before its next read (`output_delay`, used by agent/channel.py).
  Nothing is buffered meanwhile: the pipe fills, the agent's writes wait, and a background
  command's ring in the sandbox overruns (a reader is told of the gap), so the flooding session
  pays for its flood, not the server's memory nor another session.

A tenant whose output comes faster than BUSY_FRACTION of its share (sustained past the same
fraction of the burst) while others are active is told to `on_busy` (the server's tenant CPU
weights, tenant_cpu.py: its sandboxes then weigh the least): commands that never stop writing
keep the host's CPUs busy, and the other tenants' short commands wait for them in the kernel's
run queue. Well before its output is paced: a start storm's writers, starved in their own
sandboxes, rarely reach the share itself, yet fill the CPUs.

The shares are work-conserving: a tenant alone (no other tenant made a call or moved output
within `window_s`) is neither refused nor paced, so one tenant's throughput on an otherwise
idle server is unchanged. Everything reads one injected clock, so the tests are exact.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

from sandboxd.admission.bucket import TokenBucket
from sandboxd.admission.metrics import ShareMetrics
from sandboxd.errors import ResourceExhausted
from sandboxd.reasons import Reason

Clock = Callable[[], float]
MAX_HOLD_S = 1.0  # the longest a refusal is held before it is answered
BUSY_FRACTION = 0.125  # output faster than this fraction of the share marks a busy tenant


class RateLimited(ResourceExhausted):
    """A call over its tenant's share; `hold_s`: how long to hold the refusal before answering,
    `release`: to call once it is answered (or the call ended), so later refusals are held
    behind the ones still held.

    A refusal costs the server about what a bare gRPC call does (the transport, authentication),
    so clients that retry at once, ignoring RetryInfo, would load the loop with refusals alone.
    A refusal is held one token interval for each refusal of its tenant ahead of it (the ones
    still held, or the ones in a row before it; at most MAX_HOLD_S): one client retrying at
    once, or many clients of one tenant at the same time, are answered at about the tenant's
    rate in all, while a client that waits as told (one refusal, then a token) is held no
    longer than it would have waited anyway."""

    def __init__(
        self,
        message: str,
        *,
        hold_s: float,
        release: Callable[[], None] = lambda: None,
        **kw: object,
    ) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.hold_s = hold_s
        self.release = release


@dataclass(frozen=True)
class Shares:
    """What each tenant may take while others are active (sandboxd.config_sections.admission)."""

    calls_per_s: float = 50.0
    call_burst: float = 50.0
    output_bytes_per_s: float = 16 * 1024 * 1024
    output_burst_bytes: float = 4 * 1024 * 1024
    window_s: float = 1.0


class FairShares:
    """The tenants' buckets and when each was last active; O(1) per call and per read."""

    def __init__(
        self, shares: Shares, clock: Clock = time.monotonic, metrics: ShareMetrics | None = None
    ) -> None:
        self.shares = shares
        self._metrics = metrics
        self._clock = clock
        # tenant -> last activity, least recent first (moved to the end on each activity)
        self._seen: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._calls: dict[str, TokenBucket] = {}
        self._in_a_row: collections.Counter[str] = collections.Counter()  # refusals since a pass
        self._held: collections.Counter[str] = collections.Counter()  # refusals not yet answered
        self._output: dict[str, TokenBucket] = {}
        self.refused: collections.Counter[str] = collections.Counter()  # calls, by tenant
        self.paced_s: dict[str, float] = collections.defaultdict(float)  # pauses, by tenant
        self._busy: dict[str, TokenBucket] = {}  # the output share's BUSY_FRACTION
        self.on_busy: Callable[[str], None] | None = None  # told of each busy read, by tenant

    def contended(self, tenant: str, now: float | None = None) -> bool:
        """Whether another tenant was active within the window."""
        now = self._clock() if now is None else now
        self._forget_idle(now)
        for other in reversed(self._seen):  # the most recent other tenant: at most 2 steps
            if other != tenant:
                return now - self._seen[other] <= self.shares.window_s
        return False

    def admit_call(self, tenant: str) -> None:
        """Count a call of `tenant`; ResourceExhausted (with `retry_after`) over its share."""
        now = self._clock()
        contended = self.contended(tenant, now)
        self._active(tenant, now)
        if not contended:
            return
        bucket = self._calls.get(tenant)
        if bucket is None:
            s = self.shares
            bucket = self._calls[tenant] = TokenBucket(s.calls_per_s, s.call_burst, now)
        if bucket.try_take(now):
            self._in_a_row.pop(tenant, None)
            return
        self.refused[tenant] += 1
        if self._metrics is not None:
            self._metrics.refused.labels(tenant).inc()
        self._in_a_row[tenant] += 1
        ahead = max(self._in_a_row[tenant], self._held[tenant] + 1)
        hold = min(MAX_HOLD_S, ahead / self.shares.calls_per_s)
        self._held[tenant] += 1
        wait = max(0.001, bucket.wait_for(now) - hold)  # what is left to wait once answered
        raise RateLimited(
            f"tenant {tenant!r} is over its share of the server while other tenants are "
            f"active ({self.shares.calls_per_s:g} calls/s, admission_calls_per_s); "
            f"retry in {wait:.3f} s",
            reason=Reason.TENANT_RATE_LIMITED,
            metadata={
                "tenant": tenant,
                "rate": f"{self.shares.calls_per_s:g}",
                "retry_after": f"{wait:.3f}s",
            },
            hold_s=hold,
            release=lambda: self._answered(tenant),
        )

    def _answered(self, tenant: str) -> None:
        """A held refusal of `tenant` was answered: the ones after it wait one interval less."""
        if self._held[tenant] > 1:
            self._held[tenant] -= 1
        else:
            self._held.pop(tenant, None)

    def output_delay(self, tenant: str, nbytes: int) -> float:
        """Seconds the reader of `tenant`'s channel waits before its next read, having just
        read `nbytes` (0 when the tenant is alone or within its share)."""
        now = self._clock()
        contended = self.contended(tenant, now)
        self._active(tenant, now)
        if not contended:
            return 0.0
        bucket = self._output.get(tenant)
        if bucket is None:
            s = self.shares
            bucket = self._output[tenant] = TokenBucket(
                s.output_bytes_per_s, s.output_burst_bytes, now
            )
        delay = bucket.spend(now, nbytes)
        if self.on_busy is not None:
            busy = self._busy.get(tenant)
            if busy is None:
                s = self.shares
                busy = self._busy[tenant] = TokenBucket(
                    s.output_bytes_per_s * BUSY_FRACTION, s.output_burst_bytes * BUSY_FRACTION, now
                )
            if busy.spend(now, nbytes):
                self.on_busy(tenant)
        if delay:
            self.paced_s[tenant] += delay
            if self._metrics is not None:
                self._metrics.paced.labels(tenant).inc(delay)
        return delay

    def pacer(self, tenant: str) -> Callable[[int], float]:
        """`output_delay` bound to one tenant (what a channel is given)."""
        return lambda nbytes: self.output_delay(tenant, nbytes)

    @property
    def tenants_seen(self) -> int:
        return len(self._seen)

    def _active(self, tenant: str, now: float) -> None:
        self._seen[tenant] = now
        self._seen.move_to_end(tenant)

    def _forget_idle(self, now: float) -> None:
        """Drop tenants idle for longer than the window, with their buckets: what is kept
        grows with the tenants active now, never with all that ever called."""
        horizon = now - self.shares.window_s
        while self._seen:
            tenant, seen = next(iter(self._seen.items()))
            if seen >= horizon:
                return
            del self._seen[tenant]
            self._calls.pop(tenant, None)
            self._output.pop(tenant, None)
            self._busy.pop(tenant, None)
            self._in_a_row.pop(tenant, None)
