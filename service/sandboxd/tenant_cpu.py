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
the tenant when the count crosses a bucket. runsc cannot update a running sandbox's cgroups,
so a gVisor sandbox is changed in place only where the engine can (`Engine.cpu_in_place`: the
Docker adapter beside a local engine writes its host cgroup, engine/host_cgroup.py); elsewhere
it keeps the share it was made with: SECURITY.md, "CPU between tenants".

A weight splits the CPU over time, not the moment a sandbox wakes: a tenant whose sandboxes
keep the CPUs busy (commands that write as fast as they can, dozens of them after a start storm)
still makes another tenant's short commands wait in the kernel's run queue behind them, at
every wake of its agent (a start storm doubled a bystander's Run p50, its agent waiting about
8 ms per Run to be scheduled, with the flood weighing 256 x 4 against its 1024). So a tenant
whose output is busy while other tenants are active (sandboxd.admission: faster than a fraction
of its output share, the mark of commands that never stop writing) is `demote`d: its sandboxes
get DEMOTED_SHARES until it has been calm for DEMOTION_S, then their share again.

The least weight alone was not enough: even with the flood's cgroups in the kernel's idle class
(`cpu.idle`, whose tasks yield to any waking one at once), a bystander's Run stayed twice as
slow during a start storm, on two CPUs that a busy tenant keeps both running (docs/performance.md,
"Fair shares"). So a demoted tenant's sandboxes are also held, together, to
`demoted_cpu_millis` of CPU time (each an equal part, at least MIN_CPU_MILLIS, never above its
own limit), the CFS quota: the CPUs then have idle time for others' commands to wake into.
That cap is not work-conserving, which is why it lasts only while the tenant is demoted:
demotion starts only while other tenants are active, and ends DEMOTION_S after the tenant is
calm, its own limits then restored.

Nothing is made on the host beyond the sandboxes' own cgroups, which go with them: no
leftover to remove at a stop or start. After a restart the live sessions are adopted by the
reconcile (their weight then set again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sandboxd.engine.protocol import Engine
from sandboxd.errors import SandboxError
from sandboxd.isolation import Isolation
from sandboxd.models import Session

log = logging.getLogger(__name__)

TENANT_SHARES = 1024  # a tenant's sessions together: one default cgroup's weight
MIN_SHARES = 2  # the kernel's (and Docker's) least cpu.shares
DEMOTED_SHARES = MIN_SHARES  # each sandbox of a tenant over its output share (`demote`)
DEMOTION_S = 5.0  # a demoted tenant within its share this long gets its weight back
DEMOTED_CPU_MILLIS = 500  # a demoted tenant's sandboxes together, at most (0: no cap)
MIN_CPU_MILLIS = 10  # Docker's least CPU limit (0.01 of a CPU)


def share_of(live: int) -> int:
    """The weight of each sandbox of a tenant with `live` sessions."""
    if live <= 1:
        return TENANT_SHARES
    return max(MIN_SHARES, TENANT_SHARES >> (live - 1).bit_length())


@dataclass
class _Member:
    container_id: str
    isolation: Isolation
    cpu_millis: int  # the CPU limit it was made with (its session's)
    applied: int  # the weight it has now; 0: not known (adopted after a restart)
    capped: int  # the CPU limit it has now; 0: not known


class TenantCpu:
    """The live sandboxes of each tenant and the weight each was given."""

    def __init__(
        self,
        engine: Engine,
        *,
        demotion: bool = True,
        demoted_cpu_millis: int = DEMOTED_CPU_MILLIS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._demotion = demotion
        self._demoted_cpu_millis = demoted_cpu_millis
        self._clock = clock
        self._tenants: dict[str, dict[str, _Member]] = {}
        # Demoted tenant -> when it was last over its share; the task that restores it.
        self._demoted: dict[str, float] = {}
        self._restores: dict[str, asyncio.Task[None]] = {}
        # One per tenant seen, kept: a rebalance and a join or leave of the same tenant must
        # not interleave, or an update could apply a count already stale.
        self._locks: dict[str, asyncio.Lock] = {}

    def share_for_create(self, session: Session) -> int:
        """The weight a sandbox made now for `session` should be created with."""
        if session.tenant in self._demoted:
            return DEMOTED_SHARES
        members = self._tenants.get(session.tenant, {})
        return share_of(len(members.keys() - {session.session_id}) + 1)

    def shares(self, tenant: str) -> dict[str, int]:
        """Session id -> the weight its sandbox was given (for tests and diagnosis)."""
        return {sid: m.applied for sid, m in self._tenants.get(tenant, {}).items()}

    def cpu_limits(self, tenant: str) -> dict[str, int]:
        """Session id -> the CPU limit its sandbox has now, in millicpus (tests, diagnosis)."""
        return {sid: m.capped for sid, m in self._tenants.get(tenant, {}).items()}

    async def joined(self, session: Session, created_with: int) -> None:
        """`session`'s sandbox is live, made with weight `created_with` (0: the default)."""
        async with self._lock(session.tenant):
            members = self._tenants.setdefault(session.tenant, {})
            millis = session.spec.limits.cpu_millis
            members[session.session_id] = _Member(
                session.container_id,
                session.spec.isolation,
                millis,
                created_with or TENANT_SHARES,
                millis,
            )
            await self._rebalance(session.tenant)

    async def adopt(self, session: Session) -> None:
        """A running session found by the reconcile: joined, unless known with its sandbox."""
        known = self._tenants.get(session.tenant, {}).get(session.session_id)
        if known is not None and known.container_id == session.container_id:
            return
        async with self._lock(session.tenant):
            members = self._tenants.setdefault(session.tenant, {})
            members[session.session_id] = _Member(
                session.container_id, session.spec.isolation, session.spec.limits.cpu_millis, 0, 0
            )
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

    def demote(self, tenant: str) -> None:
        """`tenant`'s output is busy while others are active (called by the fair shares as
        its channels read): its sandboxes weigh DEMOTED_SHARES until it has been calm for
        DEMOTION_S. O(1) while demoted: the engine is told once per demotion."""
        if not self._demotion or tenant not in self._tenants:
            return
        self._demoted[tenant] = self._clock()
        if tenant not in self._restores:
            task = asyncio.get_running_loop().create_task(self._demoted_until_calm(tenant))
            self._restores[tenant] = task

    def demoted(self, tenant: str) -> bool:
        return tenant in self._demoted

    async def _demoted_until_calm(self, tenant: str) -> None:
        try:
            async with self._lock(tenant):
                await self._rebalance(tenant)
            while (left := self._demoted[tenant] + DEMOTION_S - self._clock()) > 0:
                await asyncio.sleep(left)
            del self._demoted[tenant]
            async with self._lock(tenant):
                await self._rebalance(tenant)
        finally:
            self._demoted.pop(tenant, None)
            self._restores.pop(tenant, None)

    async def close(self) -> None:
        """Server shutdown: no restore outlives it (the sandboxes keep what they have)."""
        tasks = list(self._restores.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _lock(self, tenant: str) -> asyncio.Lock:
        return self._locks.setdefault(tenant, asyncio.Lock())

    async def _rebalance(self, tenant: str) -> None:
        members = self._tenants.get(tenant, {})
        demoted = tenant in self._demoted
        target = DEMOTED_SHARES if demoted else share_of(len(members))
        changeable = [m for m in members.values() if self._engine.cpu_in_place(m.isolation)]
        each = 0  # the demoted tenant's cap split between its sandboxes; 0: their own limits
        if demoted and self._demoted_cpu_millis and changeable:
            each = max(MIN_CPU_MILLIS, self._demoted_cpu_millis // len(changeable))
        wanted = [(m, min(m.cpu_millis, each) if each else m.cpu_millis) for m in changeable]
        stale = [(m, limit) for m, limit in wanted if (m.applied, m.capped) != (target, limit)]
        await asyncio.gather(*(self._apply(m, target, limit) for m, limit in stale))

    async def _apply(self, member: _Member, shares: int, cpu_millis: int) -> None:
        # The limit only when it changes (an adopted sandbox's is not known: it may still have
        # the cap of a demotion that a crash interrupted, so it is set).
        limit = 0 if cpu_millis == member.capped else cpu_millis
        try:
            await self._engine.set_cpu_shares(member.container_id, shares, limit)
        except SandboxError as exc:  # gone meanwhile (its removal will be told), or busy
            log.info("could not set the CPU weight of %s: %s", member.container_id[:12], exc)
            return
        member.applied = shares
        member.capped = cpu_millis
