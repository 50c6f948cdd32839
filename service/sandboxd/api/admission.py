"""The fair-share admission of every call (sandboxd.admission), as a gRPC interceptor.

It sits right inside authentication, where the tenant is known, and outside everything else
that costs: a call over its tenant's share is refused before the audit writes anything, before
the store is read and before the servicer runs, with RESOURCE_EXHAUSTED, reason
TENANT_RATE_LIMITED, and a google.rpc.RetryInfo saying when the tenant's next token is free.
Refusals in a row, and a tenant's refusals held at the same time, are held before they are
answered (`RateLimited.hold_s`, at most 1 s, and never past the caller's deadline), so clients
that retry at once are paced by the answers instead of loading the loop with refusals.
Refusals are counted by the metrics interceptor (outside this one) like any other status; they
are not audit events, so a refusal flood cannot fill the audit log. Health and reflection
(no tenant) are never refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

from sandboxd import tenancy
from sandboxd.admission import FairShares, RateLimited
from sandboxd.api.auth import EXEMPT_PREFIXES
from sandboxd.api.chain import Layer, rewrap
from sandboxd.api.errors import to_status

_ANSWER_MARGIN_S = 0.05  # a held refusal is answered this long before the caller's deadline


async def hold(seconds: float) -> None:
    """How a refusal is held before it is answered (a module function: the tests record it)."""
    await asyncio.sleep(seconds)


async def _held(refusal: RateLimited, context: Any) -> None:
    """Hold a refusal, but answer it before the caller's deadline: a caller must get the
    refusal and its RetryInfo, not DEADLINE_EXCEEDED for a wait the server chose."""
    seconds = refusal.hold_s
    remaining = context.time_remaining()
    if remaining is not None:
        seconds = min(seconds, max(0.0, remaining - _ANSWER_MARGIN_S))
    try:
        await hold(seconds)
    finally:
        refusal.release()


class CallAdmission(Layer):
    def __init__(self, shares: FairShares) -> None:
        self.shares = shares

    def wrap(self, handler: Any, handler_call_details: Any) -> Any:
        if handler is None or str(handler_call_details.method).startswith(EXEMPT_PREFIXES):
            return handler
        return rewrap(handler, lambda _, behavior: self._admitted(behavior))

    def _admitted(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        admit = self.shares.admit_call
        if inspect.isasyncgenfunction(behavior):

            async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
                try:
                    admit(tenancy.current())
                except RateLimited as exc:
                    await _held(exc, context)
                    await context.abort_with_status(to_status(exc))
                async with contextlib.aclosing(behavior(request, context)) as items:
                    async for item in items:
                        yield item

            return streaming

        async def unary(request: Any, context: Any) -> Any:
            try:
                admit(tenancy.current())
            except RateLimited as exc:
                await _held(exc, context)
                await context.abort_with_status(to_status(exc))
            result = behavior(request, context)
            return await result if inspect.isawaitable(result) else result

        return unary
