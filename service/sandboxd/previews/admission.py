"""Who holds the preview listener's connections, so that one caller's flood is its own failure.

A connection is *pending* from its accept until its first request passed the access check
(a valid token, or a public preview), then *admitted* and counted against the tenant whose
preview it opened (moved when a later request on it opens another tenant's preview).
- Pending connections have a pool of their own (`max_pending`) and a cap per source address
  (`max_pending_per_source`; an IPv6 source counts by its /64, what one host is usually
  given): idle half-requests from one source stop at its cap, the source's next connection
  is refused at once (503) and the others' are not affected.
- When the pending pool is full, the oldest pending connection is closed for the new one: a
  flood from many sources churns its own connections, while a real client, whose head
  arrives within milliseconds, is admitted long before it would be the oldest. Every pending
  connection is also closed by the listener's head timeout.
- Admitted connections count against their tenant (`max_tenant_clients`): a tenant holding
  many connections open to its own previews reaches its cap (429), not the listener's.
- `max_clients` bounds the whole (the listener's file descriptors). The pending pool is kept
  out of it, so admitted connections hold at most `max_clients - max_pending` and a new
  connection always has a pending place. When the admitted ones fill theirs, a tenant's new
  connection takes the place of one of the tenant holding the most, as long as that tenant
  holds more than one over the newcomer (an idle kept-alive connection first, the oldest
  otherwise): tenants each at their cap cannot shut a further tenant out (a tenant's share
  falls, at the worst, to the admitted pool over the tenants holding it); past that, 503.
Pure bookkeeping with no await, so every check and its count happen together.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field


@dataclass(eq=False)
class Ticket:
    """One client connection's place: its source, its task, and its tenant once admitted."""

    source: str
    task: asyncio.Task[None] | None
    tenant: str | None = None
    # Between requests on a kept-alive connection (nothing of a request read): the first to go
    # when its tenant gives a place to another's.
    idle: bool = False


class Full(Exception):
    """The connection cannot be held (its `why` names the pool)."""

    def __init__(self, why: str, message: str) -> None:
        super().__init__(message)
        self.why, self.message = why, message


@dataclass
class Admission:
    max_clients: int
    max_pending: int
    max_pending_per_source: int = 0  # 0: no cap
    max_tenant_clients: int = 0  # 0: no cap
    _pending: collections.OrderedDict[Ticket, None] = field(default_factory=collections.OrderedDict)
    _by_source: collections.Counter[str] = field(default_factory=collections.Counter)
    _by_tenant: dict[str, collections.OrderedDict[Ticket, None]] = field(default_factory=dict)
    _admitted: int = 0
    evicted: int = 0  # pending connections closed for newer ones
    rebalanced: int = 0  # admitted connections closed for another tenant's

    @property
    def admitted_cap(self) -> int:
        """The admitted connections' pool: the whole less the pending pool's reserve."""
        return max(1, self.max_clients - self.max_pending)

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def total(self) -> int:
        return len(self._pending) + self._admitted

    def tenant_count(self, tenant: str) -> int:
        return len(self._by_tenant.get(tenant, ()))

    def arrive(self, source: str, task: asyncio.Task[None] | None) -> Ticket:
        """A new connection, pending; Full when it may not be held (close it at once)."""
        if self.max_pending_per_source and self._by_source[source] >= self.max_pending_per_source:
            raise Full("source_full", "too many connections from this address")
        if len(self._pending) >= self.max_pending:
            self._evict_oldest()
        if self.total >= self.max_clients:
            raise Full("listener_full", "too many connections")
        ticket = Ticket(source, task)
        self._pending[ticket] = None
        self._by_source[source] += 1
        return ticket

    def _evict_oldest(self) -> None:
        oldest = next(iter(self._pending))
        self._unpend(oldest)
        self.evicted += 1
        if oldest.task is not None:
            oldest.task.cancel()

    def admit(self, ticket: Ticket, tenant: str) -> None:
        """The connection's request opened `tenant`'s preview: it counts against that tenant
        from now on; Full when the tenant holds its cap already (the connection ends)."""
        if ticket.tenant == tenant:
            return
        held = self.tenant_count(tenant)
        if self.max_tenant_clients and held >= self.max_tenant_clients:
            raise Full("tenant_full", "the tenant's previews hold too many connections")
        if ticket.tenant is None:
            if ticket not in self._pending:
                raise Full("listener_full", "the connection was closed for newer ones")
            if self._admitted >= self.admitted_cap:
                self._make_room(held)
            self._unpend(ticket)
            self._admitted += 1
        else:
            self._untenant(ticket)
        ticket.tenant = tenant
        self._by_tenant.setdefault(tenant, collections.OrderedDict())[ticket] = None

    def _make_room(self, held: int) -> None:
        """Close one connection of the tenant holding the most for a tenant holding `held`,
        when that evens the shares out; Full otherwise."""
        most = max(self._by_tenant.values(), key=len, default=None)
        if most is None or len(most) <= held + 1:
            raise Full("listener_full", "too many connections")
        victim = next((t for t in most if t.idle), None) or next(iter(most))
        self._untenant(victim)
        self._admitted -= 1
        self.rebalanced += 1
        if victim.task is not None:
            victim.task.cancel()

    def leave(self, ticket: Ticket) -> None:
        """The connection ended (whatever it was)."""
        if ticket.tenant is not None:
            self._untenant(ticket)
            self._admitted -= 1
        elif ticket in self._pending:
            self._unpend(ticket)

    def _unpend(self, ticket: Ticket) -> None:
        del self._pending[ticket]
        self._by_source[ticket.source] -= 1
        if not self._by_source[ticket.source]:
            del self._by_source[ticket.source]

    def _untenant(self, ticket: Ticket) -> None:
        assert ticket.tenant is not None
        held = self._by_tenant[ticket.tenant]
        del held[ticket]
        if not held:
            del self._by_tenant[ticket.tenant]
        ticket.tenant = None
