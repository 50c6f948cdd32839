"""A tenant's session, memory and disk quotas, checked and recorded with no other create
between (the disk quota's lock is the tenant's across sessions and volumes)."""

from __future__ import annotations

import asyncio
import contextlib

from sandboxd import tenancy
from sandboxd.config import Config
from sandboxd.models import Session, SessionState
from sandboxd.storage.tenant_quota import DiskQuota
from sandboxd.store import SessionStore

# States that count against a tenant's session and memory quotas.
QUOTA_STATES = tuple(
    s.value for s in SessionState if s not in (SessionState.EXPIRED, SessionState.FAILED)
)


class QuotaGate:
    def __init__(self, config: Config, store: SessionStore, disk: DiskQuota | None = None) -> None:
        self._store = store
        self._disk = disk
        self._quotas = tenancy.TenantQuotas(
            max_sessions=config.tenancy.max_sessions,
            max_memory_bytes=config.tenancy.max_memory_bytes,
        )
        self._locks: dict[str, asyncio.Lock] = {}

    async def insert(self, session: Session) -> None:
        """Record `session` if its tenant's quotas allow one more; RESOURCE_EXHAUSTED if not."""
        lock = self._locks.setdefault(session.tenant, asyncio.Lock())
        disk = self._disk.locked(session.tenant) if self._disk is not None else None
        async with lock, disk or contextlib.nullcontext():
            count, memory = await self._store.tenant_usage(session.tenant, QUOTA_STATES)
            self._quotas.check_create(count, memory, session.spec.limits.memory_bytes)
            if self._disk is not None and session.spec.on_disk:
                size = session.spec.limits.workspace_bytes
                await self._disk.check(session.tenant, size, "a disk workspace")
            await self._store.insert(session)
