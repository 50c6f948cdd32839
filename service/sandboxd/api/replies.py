"""How large one reply message may be, and the ways a reply is made to fit.

A gRPC client refuses any message over its receive limit, 4 MiB (4194304 bytes, the whole
serialized message) by default in every language and in grpcurl, and the call then fails with
the client's own RESOURCE_EXHAUSTED: a Run that did its work loses its exit status. So no reply
is larger than the caller accepts: 4 MiB unless the request's `max_reply_bytes` says more (at
most the server's own message limit, which a client may have raised its limit to match).

`ReplyLimit` (api/reply_limit.py) reads that field for each call, keeps the call's limit here
(`current`) and refuses any reply message still over it; the RPCs whose replies grow with what
a sandbox holds make theirs fit before that:
- Run cuts its output (`cut_to_fit`): stdout and stderr together with the rest of the reply,
  measured as serialized, so the exit status arrives with `truncated` set;
- ReadFile asks the helper for at most `room_for_content` bytes, so a larger file is refused
  before it is read (`too_large`, naming ReadFileStream);
- every List serves a page cut short to fit (`fitted_page`), or where page_size 0 means "all
  in one reply", refuses one that would not fit.
`reply_bounds.REPLY_BOUNDS` names the mechanism of every RPC; a test walks the descriptors.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from google.protobuf.message import Message

from sandboxd import paging
from sandboxd.errors import InvalidArgument, ResourceExhausted, SandboxError
from sandboxd.reasons import Reason

KiB = 1024
MiB = 1024 * KiB
DEFAULT_REPLY_BYTES = 4 * MiB  # gRPC's default max_receive_message_length, every language
MIN_REPLY_BYTES = 1 * MiB  # a smaller max_reply_bytes is taken as this: every single resource fits
FIELD = "max_reply_bytes"
# Room left beside a page's entries for its other fields: the next_page_token (a signed key
# and filter: a 4 KiB path at most, base64) and the message's own framing.
_PAGE_SLACK_BYTES = 16 * KiB
_FIT_ROUNDS = 8  # a list that changes between fetches is fetched again, but not forever

_current: contextvars.ContextVar[int] = contextvars.ContextVar(
    "reply_limit", default=DEFAULT_REPLY_BYTES
)

M = TypeVar("M", bound=Message)
T = TypeVar("T")


def limit_for(asked: int, server_max: int) -> int:
    """The reply limit of a request that says `asked` (its max_reply_bytes; 0 when unset)."""
    if asked < 0:
        raise InvalidArgument(
            f"{FIELD} must not be negative (0: {DEFAULT_REPLY_BYTES}, gRPC's default)",
            reason=Reason.INVALID_ARGUMENT,
            metadata={"field": FIELD},
        )
    wanted = asked or DEFAULT_REPLY_BYTES
    return min(max(wanted, MIN_REPLY_BYTES), server_max)


def current() -> int:
    """The reply limit of the call being served (set by ReplyLimit for every call)."""
    return _current.get()


def set_current(limit: int) -> contextvars.Token[int]:
    return _current.set(limit)


def too_large(what: str, size: int, limit: int, way_round: str) -> ResourceExhausted:
    """REPLY_TOO_LARGE: `what` would be `size` bytes, over the caller's `limit`."""
    return ResourceExhausted(
        f"{what} would be {size} bytes, over the {limit} bytes this caller accepts in one reply "
        f"({FIELD}; 4 MiB when unset): {way_round}",
        reason=Reason.REPLY_TOO_LARGE,
        metadata={"limit": str(limit), "size": str(size)},
    )


def _varint_bytes(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def framed_bytes(payload: int, field_number: int = 1) -> int:
    """The serialized size of a length-delimited field whose payload is `payload` bytes."""
    return _varint_bytes(field_number << 3) + _varint_bytes(payload) + payload


def cut_to_fit(
    reply: M, fields: Sequence[str], limit: int, refill: Callable[[M], None] | None = None
) -> bool:
    """Cut the bytes `fields` of `reply` from their ends until the whole serialized message is
    at most `limit`, the longest first (none shorter than the others after a cut); `refill`
    recomputes what derives from them (text forms), which shrinks with them. True if anything
    was cut."""
    cut = False
    for _ in range(16):  # a round cuts the excess, or its share of it: few are needed
        size = reply.ByteSize()
        if size <= limit:
            return cut
        lengths = [len(getattr(reply, f)) for f in fields]
        total = sum(lengths)
        if total == 0:
            break
        excess = size - limit
        if refill is not None:  # what derives from the bytes shrinks with them: cut a share
            excess = max(1, -(-total * excess // size))
        cap = _level(lengths, min(excess, total))
        for name, length in zip(fields, lengths, strict=True):
            if length > cap:
                setattr(reply, name, getattr(reply, name)[:cap])
        if refill is not None:
            refill(reply)
        cut = True
    raise too_large("the reply", reply.ByteSize(), limit, "its fixed fields do not fit")


def _level(lengths: Sequence[int], excess: int) -> int:
    """The largest cap whose cutting of every length over it removes at least `excess`."""
    lo, hi = 0, max(lengths)
    while lo < hi:  # the largest cap with sum(max(0, n - cap)) >= excess
        mid = (lo + hi + 1) // 2
        if sum(max(0, n - mid) for n in lengths) >= excess:
            lo = mid
        else:
            hi = mid - 1
    return lo


def room_for_content(limit: int, others: int) -> int:
    """The bytes one bytes field may carry in a reply of `limit` bytes whose other fields take
    at most `others` bytes: what is left after them and the field's own tag and length."""
    return max(0, limit - others - (framed_bytes(limit) - limit))


async def fitted_page(
    fetch: Callable[[int], Awaitable[M]],
    items: str,
    page_size: int,
    *,
    whole: Callable[[int, int], SandboxError] | None = None,
) -> M:
    """The reply of one List call, at most the call's reply limit.

    `fetch(n)` builds the reply of a page of at most `n` entries after the request's token
    (`n` 0: the request's own page size); a page over the limit is fetched again with as many
    entries as fit, so its next_page_token continues right after them. `whole` is given when
    the request asked for everything in one reply: then a reply over the limit is refused
    with its error (`whole(size, limit)`) rather than cut.
    """
    limit = current()
    reply = await fetch(page_size)
    for _ in range(_FIT_ROUNDS):
        size = reply.ByteSize()
        if size <= limit:
            return reply
        if whole is not None:
            raise whole(size, limit)
        entries = getattr(reply, items)
        room = limit - _PAGE_SLACK_BYTES
        fit, used = 0, 0
        for entry in entries:
            used += framed_bytes(entry.ByteSize())
            if used > room:
                break
            fit += 1
        fit = min(fit, len(entries) - 1)
        if fit <= 0:
            raise too_large(
                "one entry of this list", size, limit, "raise max_reply_bytes to read it"
            )
        reply = await fetch(fit)
    raise too_large("this page", reply.ByteSize(), limit, "ask for a smaller page_size")


async def held_page(
    items: Sequence[T],
    key: Callable[[T], str],
    request: Any,
    bound: str,
    reply: Callable[[Sequence[T], str], M],
    field: str,
    whole: Callable[[int, int], SandboxError],
    *,
    sort: bool = True,
) -> M:
    """The reply of a List whose entries the server holds whole in memory (processes, a
    listing, images): with page_size or page_token, a page of them by `key` (sorted first
    unless they already are, `sort` False) bound to `bound`; without, all of them in one
    reply, refused with `whole` when it would not fit. `reply(entries, next_page_token)`
    builds the message. One place for the three, so they page and refuse alike."""
    paged = bool(request.page_size or request.page_token)
    if paged and sort:
        items = sorted(items, key=key)

    async def fetch(size: int) -> M:
        chosen, token = items, ""
        if paged:
            chosen, token = paging.page(
                items, key, paging.page_size(size), request.page_token, bound
            )
        return reply(chosen, token)

    return await fitted_page(fetch, field, request.page_size, whole=None if paged else whole)
