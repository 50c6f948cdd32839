"""A tenant's session and memory quotas, checked and recorded with no other create between."""

from __future__ import annotations

import asyncio

from sandboxd import tenancy
from sandboxd.config import Config
from sandboxd.models import Session, SessionState
from sandboxd.store import SessionStore

# States that count against a tenant's session and memory quotas.
QUOTA_STATES = tuple(
    s.value for s in SessionState if s not in (SessionState.EXPIRED, SessionState.FAILED)
)


class QuotaGate:
    def __init__(self, config: Config, store: SessionStore) -> None:
        self._store = store
        self._quotas = tenancy.TenantQuotas(
            max_sessions=config.tenant_max_sessions,
            max_memory_bytes=config.tenant_max_memory_bytes,
        )
        self._locks: dict[str, asyncio.Lock] = {}

    async def insert(self, session: Session) -> None:
        """Record `session` if its tenant's quotas allow one more; RESOURCE_EXHAUSTED if not."""
        lock = self._locks.setdefault(session.tenant, asyncio.Lock())
        async with lock:
            count, memory = await self._store.tenant_usage(session.tenant, QUOTA_STATES)
            self._quotas.check_create(count, memory, session.spec.limits.memory_bytes)
            await self._store.insert(session)
