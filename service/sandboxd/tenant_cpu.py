"""Each tenant's sessions share one CPU weight at the kernel, whatever their number.

The fair shares (sandboxd.admission) bound what a tenant takes of the server; the CPU its
commands burn is the host kernel's to split. Each sandbox is a cgroup, and the kernel splits a
busy CPU between cgroups by their weight (cpu.shares, 1024 by default): left alone, a tenant
with four busy sessions would hold four times the CPU of a tenant with one. Here every
sandbox of a tenant with n live sessions gets `share_of(n)`, about TENANT_SHARES / n, so the
tenant's sessions together weigh about one default sandbox.

The share is a power-of-two fraction (1024, 512, 256, 256, 128 x 4, ...): a tenant's total is
between half and all of TENANT_SHARES, and its sandboxes are updated only when its count
crosses a power of two, so a create or a delete costs a bounded number of engine updates on
average, never one for each of its sessions.

A cold create is made with the share it will have (`SandboxRequest.cpu_shares`); a warm pool
member, made before its tenant was known, gets it in place when claimed, as do the others of
the tenant when the count crosses a bucket. Only the runc tier can be changed in place: runsc
cannot update a running sandbox's cgroups, so a gVisor sandbox keeps the share it was made
with (a claimed gVisor pool member the default one): SECURITY.md, "CPU between tenants".

Nothing is made on the host beyond the sandboxes' own cgroups, which go with them: no
leftover to remove at a stop or start. After a restart the live sessions are adopted by the
reconcile (their weight then set again).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sandboxd.engine.protocol import Engine
from sandboxd.errors import SandboxError
from sandboxd.isolation import Isolation
from sandboxd.models import Session

log = logging.getLogger(__name__)

TENANT_SHARES = 1024  # a tenant's sessions together: one default cgroup's weight
MIN_SHARES = 2  # the kernel's (and Docker's) least cpu.shares


def share_of(live: int) -> int:
    """The weight of each sandbox of a tenant with `live` sessions."""
    if live <= 1:
        return TENANT_SHARES
    return max(MIN_SHARES, TENANT_SHARES >> (live - 1).bit_length())


@dataclass
class _Member:
    container_id: str
    isolation: Isolation
    applied: int  # the weight it has now; 0: not known (adopted after a restart)


class TenantCpu:
    """The live sandboxes of each tenant and the weight each was given."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._tenants: dict[str, dict[str, _Member]] = {}
        # One per tenant seen, kept: a rebalance and a join or leave of the same tenant must
        # not interleave, or an update could apply a count already stale.
        self._locks: dict[str, asyncio.Lock] = {}

    def share_for_create(self, session: Session) -> int:
        """The weight a sandbox made now for `session` should be created with."""
        members = self._tenants.get(session.tenant, {})
        return share_of(len(members.keys() - {session.session_id}) + 1)

    def shares(self, tenant: str) -> dict[str, int]:
        """Session id -> the weight its sandbox was given (for tests and diagnosis)."""
        return {sid: m.applied for sid, m in self._tenants.get(tenant, {}).items()}

    async def joined(self, session: Session, created_with: int) -> None:
        """`session`'s sandbox is live, made with weight `created_with` (0: the default)."""
        async with self._lock(session.tenant):
            members = self._tenants.setdefault(session.tenant, {})
            members[session.session_id] = _Member(
                session.container_id, session.spec.isolation, created_with or TENANT_SHARES
            )
            await self._rebalance(session.tenant)

    async def adopt(self, session: Session) -> None:
        """A running session found by the reconcile: joined, unless known with its sandbox."""
        known = self._tenants.get(session.tenant, {}).get(session.session_id)
        if known is not None and known.container_id == session.container_id:
            return
        async with self._lock(session.tenant):
            members = self._tenants.setdefault(session.tenant, {})
            members[session.session_id] = _Member(session.container_id, session.spec.isolation, 0)
            await self._rebalance(session.tenant)

    async def left(self, session: Session) -> None:
        """`session`'s sandbox is gone (removed or lost): the others of its tenant weigh more."""
        if session.session_id not in self._tenants.get(session.tenant, {}):
            return
        async with self._lock(session.tenant):
            members = self._tenants.get(session.tenant, {})
            members.pop(session.session_id, None)
            if not members:
                self._tenants.pop(session.tenant, None)
                return
            await self._rebalance(session.tenant)

    def _lock(self, tenant: str) -> asyncio.Lock:
        return self._locks.setdefault(tenant, asyncio.Lock())

    async def _rebalance(self, tenant: str) -> None:
        target = share_of(len(self._tenants.get(tenant, {})))
        stale = [
            m
            for m in self._tenants.get(tenant, {}).values()
            if m.isolation is Isolation.RUNC and m.applied != target
        ]
        await asyncio.gather(*(self._apply(m, target) for m in stale))

    async def _apply(self, member: _Member, shares: int) -> None:
        try:
            await self._engine.set_cpu_shares(member.container_id, shares)
        except SandboxError as exc:  # gone meanwhile (its removal will be told), or busy
            log.info("could not set the CPU weight of %s: %s", member.container_id[:12], exc)
            return
        member.applied = shares
