"""Tenants: who is calling (a contextvar), their bearer tokens, and their quotas.

Independent of gRPC: the interceptor in `sandboxd.api.auth` authenticates a call with a
`TokenTable` and runs the handler with `current_tenant` set; the domain reads the tenant from
here, so every lookup can be scoped without threading a parameter through every layer.

Without a tokens file there is one implicit tenant, `DEFAULT_TENANT`, and nothing changes for
callers. With one, session ids stay global (they name containers) but are partitioned: a
caller-chosen id must start with `<tenant>.`, so two tenants can never contend for one id and
a create never has to answer "taken by someone else" (which would leak existence). Another
tenant's id is NOT_FOUND on every RPC, exactly like a missing one.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sandboxd.errors import InvalidArgument, ResourceExhausted
from sandboxd.reasons import Reason
from sandboxd.tokens import (
    LOCAL_GRANTS,
    NO_GRANTS,
    TENANT_RE,
    TenantGrants,
    TokenTable,
    load_tokens,
    token_digest,
)

__all__ = [
    "DEFAULT_TENANT",
    "LOCAL_GRANTS",
    "NO_GRANTS",
    "TENANT_RE",
    "ExecSlots",
    "StreamSlots",
    "TenantSlots",
    "TenantGrants",
    "TenantQuotas",
    "TokenTable",
    "check_session_id",
    "current",
    "current_grants",
    "current_tenant",
    "generated_session_id",
    "tenant_of_session",
    "load_tokens",
    "private_networks_allowed",
    "resolved_grants",
    "use_grants",
    "token_digest",
    "use_tenant",
]

DEFAULT_TENANT = "default"

current_tenant: contextvars.ContextVar[str] = contextvars.ContextVar(
    "sandboxd_tenant", default=DEFAULT_TENANT
)
# True only while serving a call authenticated against a tokens file: ids are then partitioned.
_authenticated: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "sandboxd_authenticated", default=False
)


# The grants of the authenticated tenant; without a tokens file the local tenant's (admin).
_grants_var: contextvars.ContextVar[TenantGrants] = contextvars.ContextVar("sandboxd_grants")


def current_grants() -> TenantGrants:
    """What the operator granted the tenant of the call being served."""
    return _grants_var.get(LOCAL_GRANTS)


def private_networks_allowed(server_setting: str, grants: TenantGrants) -> bool:
    """The tenant's grant from the tokens file, else the server's `egress_private_networks`."""
    if grants.private_networks is not None:
        return grants.private_networks
    return server_setting == "allow"


def resolved_grants(grants: TenantGrants, server_private_networks: str) -> TenantGrants:
    """The grants with the server's setting folded in: `private_networks` is then a bool."""
    allowed = private_networks_allowed(server_private_networks, grants)
    return dataclasses.replace(grants, private_networks=allowed)


def use_grants(grants: TenantGrants) -> None:
    """Set the grants of the call being served (the local tenant, without a tokens file)."""
    _grants_var.set(grants)


def current() -> str:
    """The tenant of the call being served (`DEFAULT_TENANT` without authentication)."""
    return current_tenant.get()


def use_tenant(tenant: str, grants: TenantGrants | None = None) -> None:
    """Mark the running task as serving an authenticated `tenant` (each RPC is its own task)."""
    current_tenant.set(tenant)
    _authenticated.set(True)
    _grants_var.set(NO_GRANTS if grants is None else grants)


def check_session_id(session_id: str) -> None:
    """Refuse a caller-chosen id outside the calling tenant's part of the id space.

    The answer depends on the text alone, never on which ids exist.
    """
    if not _authenticated.get():
        return
    prefix = current() + "."
    if not session_id.startswith(prefix) or len(session_id) == len(prefix):
        raise InvalidArgument(
            f"session id {session_id!r} must start with {prefix!r}: with authentication "
            "on, each tenant chooses ids only under its own prefix",
            reason=Reason.INVALID_SESSION_ID,
            metadata={"session_id": session_id, "prefix": prefix},
        )


def tenant_of_session(session_id: str, partitioned: bool) -> str:
    """The tenant a session id belongs to: its prefix when ids are partitioned (a tokens file
    is configured), else the one local tenant. For work that runs outside any call (an agent
    channel's reader), where `current()` does not apply."""
    if partitioned:
        prefix, dot, _ = session_id.partition(".")
        if dot and TENANT_RE.match(prefix):
            return prefix
    return DEFAULT_TENANT


def generated_session_id(random_hex: str) -> str:
    """A server-chosen id, under the tenant's prefix when ids are partitioned."""
    if _authenticated.get():
        return f"{current()}.s-{random_hex}"
    return f"s-{random_hex}"


# --------------------------------------------------------------------------------------------
# Quotas
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantQuotas:
    """Per-tenant caps; 0 means unlimited."""

    max_sessions: int = 0
    max_memory_bytes: int = 0
    max_concurrent_execs: int = 0

    def check_create(self, live_sessions: int, live_memory: int, new_memory: int) -> None:
        """Refuse a session that would put the tenant over a cap (live = not expired)."""
        tenant = current()
        if self.max_sessions and live_sessions + 1 > self.max_sessions:
            raise ResourceExhausted(
                f"tenant {tenant!r} already has {live_sessions} sessions; the quota is "
                f"{self.max_sessions} (delete one or wait for a lease to end)",
                reason=Reason.TENANT_SESSION_QUOTA,
                metadata={"tenant": tenant, "quota": str(self.max_sessions)},
            )
        if self.max_memory_bytes and live_memory + new_memory > self.max_memory_bytes:
            raise ResourceExhausted(
                f"tenant {tenant!r} sessions hold {live_memory} bytes of memory; "
                f"{new_memory} more would exceed the quota of {self.max_memory_bytes}",
                reason=Reason.TENANT_MEMORY_QUOTA,
                metadata={"tenant": tenant, "quota": str(self.max_memory_bytes)},
            )


@dataclass
class TenantSlots:
    """Counts what each tenant holds at once; refuses one over the cap at once (0: no cap)."""

    limit: int = 0
    reason: str = Reason.RESOURCE_EXHAUSTED
    refusal: str = "already holds {limit}, its quota"  # after "tenant 'x' "
    _held: collections.Counter[str] = field(default_factory=collections.Counter)

    def running(self, tenant: str) -> int:
        return self._held[tenant]

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the calling tenant's slots for the duration of the block."""
        tenant = current()
        # Check and count with no await between them: one event loop, so no race.
        if self.limit and self._held[tenant] >= self.limit:
            raise ResourceExhausted(
                f"tenant {tenant!r} " + self.refusal.format(limit=self.limit),
                reason=self.reason,
                metadata={"tenant": tenant, "quota": str(self.limit)},
            )
        self._held[tenant] += 1
        try:
            yield
        finally:
            self._held -= collections.Counter({tenant: 1})  # drops the tenant at zero


@dataclass
class ExecSlots(TenantSlots):
    """Commands each tenant is running (`tenant_max_concurrent_execs`)."""

    reason: str = Reason.TENANT_EXEC_QUOTA
    refusal: str = (
        "is already running {limit} commands, its quota of concurrent execs; wait for one to finish"
    )


@dataclass
class StreamSlots(TenantSlots):
    """Streaming calls each tenant has open (`tenant_max_streams`)."""

    reason: str = Reason.TENANT_STREAM_QUOTA
    refusal: str = "already has {limit} open streams, its quota (tenant_max_streams); close one"
