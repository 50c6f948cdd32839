"""A token bucket over an injected clock: the one rate primitive of the fair shares.

Pure arithmetic on the times it is given (no clock read, no sleep), so every test of it and of
what is built on it is deterministic. A bucket may go into debt (`spend`): the caller that
spends past zero is told how long the debt takes to repay, and pauses that long; that is how
a byte flow is paced without refusing it.
"""

from __future__ import annotations


class TokenBucket:
    """`rate` tokens a second, at most `burst` held; starts full."""

    __slots__ = ("rate", "burst", "_tokens", "_at")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("a token bucket needs a positive rate and burst")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = now

    def tokens(self, now: float) -> float:
        """What the bucket holds at `now` (negative while in debt)."""
        self._refill(now)
        return self._tokens

    def try_take(self, now: float, n: float = 1.0) -> bool:
        """Take `n` tokens if the bucket holds them; False (nothing taken) if not."""
        self._refill(now)
        if self._tokens < n:
            return False
        self._tokens -= n
        return True

    def wait_for(self, now: float, n: float = 1.0) -> float:
        """Seconds until `n` tokens are held (0 if they are now)."""
        self._refill(now)
        return max(0.0, (n - self._tokens) / self.rate)

    def spend(self, now: float, n: float) -> float:
        """Take `n` tokens, into debt if need be; the seconds until the debt is repaid. The debt
        is never forgiven while the bucket lives (several readers spending one bucket would
        otherwise move more than its rate); the caller bounds each single pause."""
        self._refill(now)
        self._tokens -= n
        return max(0.0, -self._tokens / self.rate)

    def refill_full(self, now: float) -> None:
        """Forget any debt and fill up (the tenant is alone again: nothing is owed to anyone)."""
        self._tokens = self.burst
        self._at = now

    def full(self, now: float) -> bool:
        return self.tokens(now) >= self.burst

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
