"""The tokens file as a running server holds it: read at start-up, read again on SIGHUP.

Rotating a tenant's token must not need a restart (which would end every stream of every
tenant). On SIGHUP the file is parsed whole, beside the table in use; only a file that parses
replaces it, in one assignment, so a call is checked against the old table or the new one and
never against half a file. A file that does not parse keeps the old table and says why in the
log. What changed is logged by tenant (added, removed, tokens changed, grants changed), never a
token or a digest.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from sandboxd import tenancy
from sandboxd.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenChanges:
    """What one reload changed, by tenant name."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    tokens_changed: tuple[str, ...] = ()
    grants_changed: tuple[str, ...] = ()

    @classmethod
    def between(cls, old: tenancy.TokenTable, new: tenancy.TokenTable) -> TokenChanges:
        def digests(table: tenancy.TokenTable, tenant: str) -> frozenset[bytes]:
            return frozenset(d for t, d in table.entries if t == tenant)

        kept = sorted(old.tenants & new.tenants)
        return cls(
            added=tuple(sorted(new.tenants - old.tenants)),
            removed=tuple(sorted(old.tenants - new.tenants)),
            tokens_changed=tuple(t for t in kept if digests(old, t) != digests(new, t)),
            grants_changed=tuple(t for t in kept if old.grants_of(t) != new.grants_of(t)),
        )

    def __str__(self) -> str:
        parts = [
            f"{what}: {', '.join(names)}"
            for what, names in (
                ("tenants added", self.added),
                ("tenants removed", self.removed),
                ("tokens changed", self.tokens_changed),
                ("grants changed", self.grants_changed),
            )
            if names
        ]
        return "; ".join(parts) or "nothing changed"


class TokenFile:
    """The tenants' tokens and grants from `tokens_file`, replaced whole by `reload`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.table = tenancy.load_tokens(path)

    def authenticate(self, token: str) -> str | None:
        return self.table.authenticate(token)

    def grants_of(self, tenant: str) -> tenancy.TenantGrants:
        return self.table.grants_of(tenant)

    def reload(self) -> TokenChanges:
        """Read the file again; ConfigError (the table in use kept) if it does not parse."""
        return self._replace(tenancy.load_tokens(self.path))

    async def reload_on(self, signalled: asyncio.Event) -> None:
        """Reload each time `signalled` is set (the SIGHUP handler sets it), until cancelled."""
        while True:
            await signalled.wait()
            signalled.clear()
            try:
                # The file is read off the loop; the table is replaced on it, between calls.
                new = await asyncio.to_thread(tenancy.load_tokens, self.path)
            except ConfigError as exc:
                log.error("tokens file not reloaded, the tokens in use are kept: %s", exc)
                continue
            changes = self._replace(new)
            log.info(
                "tokens file %s reloaded: %d token(s) for %d tenant(s); %s",
                self.path,
                len(new.entries),
                len(new.tenants),
                changes,
            )

    def _replace(self, new: tenancy.TokenTable) -> TokenChanges:
        changes = TokenChanges.between(self.table, new)
        self.table = new
        return changes
