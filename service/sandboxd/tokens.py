"""The tokens file's grammar: tenants, the sha256 digests of their bearer tokens, and what
the operator granted each (`admin`, private networks, an image allowlist, isolation tiers,
public previews).

Pure and below every room: the configuration's checks parse the file at start-up with it
(`sandboxd.config`), the running server holds the parsed table (`sandboxd.token_file`) and
the call's tenant and grants are `sandboxd.tenancy`'s, which re-exports these names.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sandboxd.errors import ConfigError
from sandboxd.isolation import parse_tiers
from sandboxd.validation.image_refs import parse_patterns

__all__ = [
    "LOCAL_GRANTS",
    "MAX_TOKEN_BYTES",
    "NO_GRANTS",
    "TENANT_RE",
    "TenantGrants",
    "TokenTable",
    "load_tokens",
    "token_digest",
]

# No '.' in a tenant name: '.' ends the tenant prefix of a session id, so it is unambiguous.
TENANT_RE = re.compile(r"\A[a-z0-9][a-z0-9_-]{0,31}\Z")
_DIGEST_RE = re.compile(r"\A[0-9a-fA-F]{64}\Z")
MAX_TOKEN_BYTES = 4096  # longer presented tokens are refused before hashing


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


def _checked(where: str, key: str, value: str, parse: Callable[[str], object]) -> str:
    """`value` as written, once `parse` accepts it; its refusal names the line and the option."""
    try:
        parse(value)
    except (ValueError, ConfigError) as exc:
        raise ConfigError(f"{where}: {key}: {exc}") from None
    return value


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
            images = _checked(where, key, value, parse_patterns)
        elif sep and key == "isolation":
            tiers = _checked(where, key, value, parse_tiers)
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
