"""Safe retries by request id (AIP-155) for calls that create something under an id the
server chooses (CreateSnapshot): the first call with a request id does the work, a retry
with the same id gets the first call's result instead of a second copy.

Kept in memory, bounded (the oldest ids go first), per tenant: a retry is expected within
seconds or minutes, not across a server restart.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from sandboxd import tenancy
from sandboxd.errors import InvalidArgument
from sandboxd.reasons import Reason

MAX_REQUEST_ID_CHARS = 128
REMEMBERED = 10_000


def validate_request_id(request_id: str) -> str:
    if len(request_id) > MAX_REQUEST_ID_CHARS or not request_id.isprintable():
        raise InvalidArgument(
            f"request_id must be at most {MAX_REQUEST_ID_CHARS} printable characters",
            reason=Reason.INVALID_ARGUMENT,
            metadata={"field": "request_id"},
        )
    return request_id


class RequestIds:
    """request id -> the id of what its first call made."""

    def __init__(self, remembered: int = REMEMBERED) -> None:
        self._done: OrderedDict[tuple[str, str, str], str] = OrderedDict()
        self._locks: dict[tuple[str, str, str], asyncio.Lock] = {}
        self._remembered = remembered

    async def once(
        self,
        kind: str,
        request_id: str,
        make: Callable[[], Awaitable[str]],
        still_there: Callable[[str], Awaitable[bool]],
    ) -> tuple[str, bool]:
        """(id, made now): `make()` for a new request id; the first call's id for a retry
        while `still_there(id)` (a deleted result is made again). Concurrent calls with one
        request id wait for each other, so only one makes."""
        key = (str(tenancy.current()), kind, validate_request_id(request_id))
        if len(self._locks) > self._remembered:  # idle locks go; a held one stays
            self._locks = {k: v for k, v in self._locks.items() if v.locked()}
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            done = self._done.get(key)
            if done is not None and await still_there(done):
                self._done.move_to_end(key)
                return done, False
            made = await make()
            self._done[key] = made
            while len(self._done) > self._remembered:
                self._done.popitem(last=False)
            return made, True
