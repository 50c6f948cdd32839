"""Isolation tiers: which kernel boundary a session's sandbox runs behind.

`runc` shares the host kernel (namespaces, cgroups, seccomp); `gvisor` puts a user-space
kernel (runsc) between the sandbox and the host. Which tiers a session may ask for is the
intersection of what the operator allows (`[isolation]` settings) and what the engine can run
right now (its registered runtimes, found at start-up and re-checked whenever the engine comes
back). A tier that is not available is refused with FAILED_PRECONDITION and a reason: a session
never silently runs under a weaker tier than it asked for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from enum import StrEnum
from typing import Protocol

from sandboxd.errors import ConfigError, FailedPrecondition
from sandboxd.reasons import Reason

log = logging.getLogger(__name__)


class Isolation(StrEnum):
    RUNC = "runc"
    GVISOR = "gvisor"


def parse_tier(value: str) -> Isolation:
    try:
        return Isolation(value.strip().lower())
    except ValueError:
        known = ", ".join(t.value for t in Isolation)
        raise ConfigError(f"unknown isolation tier {value!r} (known: {known})") from None


def parse_tiers(value: str) -> frozenset[Isolation]:
    """A comma-separated list of tiers; empty is refused (no session could be created)."""
    tiers = frozenset(parse_tier(v) for v in value.split(",") if v.strip())
    if not tiers:
        raise ConfigError("isolation_allowed names no tier")
    return tiers


class _TierSource(Protocol):
    async def isolation_tiers(self) -> frozenset[Isolation]: ...


class IsolationTiers:
    """The tiers allowed by the operator and offered by the engine, and the choice for a
    create request. Reads are pure; `refresh` is the one call that asks the engine."""

    def __init__(self, default: Isolation, allowed: Iterable[Isolation]) -> None:
        self._default = default
        self._allowed = frozenset(allowed)
        if default not in self._allowed:
            raise ConfigError(
                f"isolation_default {default.value!r} is not in isolation_allowed "
                f"({', '.join(sorted(t.value for t in self._allowed))})"
            )
        # Until the engine has been asked, only runc is assumed (every Docker engine has it).
        self._engine: frozenset[Isolation] = frozenset({Isolation.RUNC})

    async def refresh(self, engine: _TierSource) -> frozenset[Isolation]:
        """Ask the engine which tiers it can run now; a failure keeps the last answer."""
        found = await engine.isolation_tiers()
        if found != self._engine:
            log.info(
                "engine isolation tiers: %s", ", ".join(sorted(t.value for t in found)) or "none"
            )
        self._engine = found
        return found

    def available(self) -> list[Isolation]:
        """What a session may ask for on this server now, in a stable order."""
        return [t for t in Isolation if t in self._allowed and t in self._engine]

    def choose(self, asked: Isolation | None, tenant_tiers: str | None = None) -> Isolation:
        """The tier for a create request (`None` = the default), or the refusal.

        `tenant_tiers` is the tenant's tokens-file option (`isolation=gvisor,runc`): its tiers
        replace the server's allowed set for that tenant, the first being its default.
        """
        default, allowed = self._default, self._allowed
        if tenant_tiers is not None:
            ordered = [parse_tier(v) for v in tenant_tiers.split(",") if v.strip()]
            default, allowed = ordered[0], frozenset(ordered)
        tier = default if asked is None else asked
        if tier not in allowed:
            raise FailedPrecondition(
                f"isolation {tier.value!r} is not allowed for this tenant "
                f"(allowed: {', '.join(t.value for t in Isolation if t in allowed)})",
                reason=Reason.ISOLATION_NOT_ALLOWED,
                metadata={"isolation": tier.value},
            )
        if tier not in self._engine:
            raise FailedPrecondition(
                f"isolation {tier.value!r} is not available: the engine has no runtime for it "
                "(an operator can install it with `make gvisor`)",
                reason=Reason.ISOLATION_UNAVAILABLE,
                metadata={"isolation": tier.value},
            )
        return tier
