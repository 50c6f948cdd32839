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
import hashlib
import hmac
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from sandboxd.errors import ConfigError, InvalidArgument, ResourceExhausted
from sandboxd.reasons import Reason

__all__ = [
    "DEFAULT_TENANT",
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
# No '.' in a tenant name: '.' ends the tenant prefix of a session id, so it is unambiguous.
TENANT_RE = re.compile(r"\A[a-z0-9][a-z0-9_-]{0,31}\Z")
_DIGEST_RE = re.compile(r"\A[0-9a-fA-F]{64}\Z")
MAX_TOKEN_BYTES = 4096  # longer presented tokens are refused before hashing

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


def token_digest(token: str | bytes) -> str:
    """The sha256 hex digest a tokens file stores instead of the token."""
    raw = token.encode() if isinstance(token, str) else token
    return hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True)
class TenantGrants:
    """What the operator granted a tenant in the tokens file, beyond the server's settings.

    None: the server's setting applies. `admin`: may call AdminService.
    """

    admin: bool = False
    private_networks: bool | None = None
    image_allowlist: str | None = None
    isolation: str | None = None  # the tenant's tiers, its default first (server's if None)
    preview_public: bool = False  # may publish a port with `public: true` (no token)

    def merged(self, other: TenantGrants) -> TenantGrants:
        """One tenant on several lines: a grant on any line holds; allowlists add up."""
        images = [i for i in (self.image_allowlist, other.image_allowlist) if i is not None]
        private = [p for p in (self.private_networks, other.private_networks) if p is not None]
        tiers = [t for t in (self.isolation, other.isolation) if t is not None]
        return TenantGrants(
            admin=self.admin or other.admin,
            private_networks=any(private) if private else None,
            image_allowlist=",".join(images) if images else None,
            isolation=",".join(tiers) if tiers else None,
            preview_public=self.preview_public or other.preview_public,
        )


# Without a tokens file the one local tenant is the operator: it may administer.
LOCAL_GRANTS = TenantGrants(admin=True, preview_public=True)
NO_GRANTS = TenantGrants()


@dataclass(frozen=True)
class TokenTable:
    """(tenant, sha256 digest) pairs; lookups compare every entry in constant time."""

    entries: tuple[tuple[str, bytes], ...]
    grants: dict[str, TenantGrants] = field(default_factory=dict, compare=False)

    def grants_of(self, tenant: str) -> TenantGrants:
        return self.grants.get(tenant, NO_GRANTS)

    def authenticate(self, token: str) -> str | None:
        """The tenant the token belongs to, or None.

        Every entry is compared with `hmac.compare_digest` on digests, and the loop never
        stops early, so timing says nothing about which entry (or how much of it) matched.
        """
        raw = token.encode("utf-8", "surrogateescape")
        if not raw or len(raw) > MAX_TOKEN_BYTES:
            return None
        presented = hashlib.sha256(raw).digest()
        found: str | None = None
        for tenant, digest in self.entries:
            if hmac.compare_digest(presented, digest) and found is None:
                found = tenant
        return found

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(t for t, _ in self.entries)


def _grants(where: str, options: list[str]) -> TenantGrants:
    """`admin`, `egress_private_networks=allow|deny`, `image_allowlist=pattern,pattern`."""
    admin, private, images, tiers, public = False, None, None, None, False
    for option in options:
        key, sep, value = option.partition("=")
        if option == "admin":
            admin = True
        elif option == "preview_public":
            public = True
        elif sep and key == "egress_private_networks" and value in ("allow", "deny"):
            private = value == "allow"
        elif sep and key == "image_allowlist":
            from sandboxd.images import parse_patterns  # images imports nothing from here

            try:
                parse_patterns(value)
            except ValueError as exc:
                raise ConfigError(f"{where}: image_allowlist: {exc}") from None
            images = value
        elif sep and key == "isolation":
            from sandboxd.isolation import parse_tiers  # isolation imports nothing from here

            try:
                parse_tiers(value)
            except ConfigError as exc:
                raise ConfigError(f"{where}: isolation: {exc}") from None
            tiers = value
        else:
            raise ConfigError(
                f"{where}: unknown option {option[:60]!r} (known: admin, "
                "egress_private_networks=allow|deny, image_allowlist=pattern,..., "
                "isolation=tier,..., preview_public)"
            )
    return TenantGrants(admin, private, images, tiers, public)


def load_tokens(path: Path) -> TokenTable:
    """Parse `tenant sha256hex [option...]` lines ('#' comments and blank lines allowed).

    Options (README, "Authentication"): `admin`, `egress_private_networks=allow|deny`,
    `image_allowlist=pattern,pattern`. A line of two words is valid as before.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"tokens_file {str(path)!r}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"tokens_file {str(path)!r}: not UTF-8 text") from None
    entries: list[tuple[str, bytes]] = []
    grants: dict[str, TenantGrants] = {}
    seen: set[bytes] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"tokens_file {str(path)!r} line {number}"
        parts = line.split()
        if len(parts) < 2:
            raise ConfigError(f"{where}: expected 'tenant sha256hex' and options")
        tenant, digest = parts[:2]
        if not TENANT_RE.match(tenant):
            raise ConfigError(
                f"{where}: tenant {tenant!r} must be 1-32 of a-z, 0-9, '_', '-' "
                "starting with a letter or digit"
            )
        if not _DIGEST_RE.match(digest):
            raise ConfigError(
                f"{where}: {digest[:16]!r}... is not a sha256 hex digest (64 hex digits); "
                "store sha256(token), never the token"
            )
        value = bytes.fromhex(digest)
        if value in seen:
            raise ConfigError(f"{where}: the same token digest appears twice")
        seen.add(value)
        entries.append((tenant, value))
        line_grants = _grants(where, parts[2:])
        grants[tenant] = grants[tenant].merged(line_grants) if tenant in grants else line_grants
    if not entries:
        raise ConfigError(f"tokens_file {str(path)!r}: no 'tenant sha256hex' lines")
    return TokenTable(tuple(entries), grants)


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
