"""The one page-token codec of the API's List calls (sessions, snapshots, egress events,
processes, directory listings).

A token is opaque (AIP-158): the URL-safe base64 of the last key of the page, the filter that
made the page, and an HMAC-SHA256 over both under a key this server process drew at start. So
a token cannot be forged or edited, and one made for another filter (other labels, another
session, another folder) or by another list is INVALID_PAGE_TOKEN rather than a silently wrong
page. Tokens do not survive a server restart (the key is new): the caller lists again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Callable, Sequence
from typing import TypeVar

from sandboxd import base64url
from sandboxd.errors import InvalidArgument
from sandboxd.reasons import Reason

MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100
_KEY = secrets.token_bytes(32)
_MAC_BYTES = 16

T = TypeVar("T")


def page_size(asked: int) -> int:
    """The page size to serve: the default for 0, capped at the maximum."""
    if asked < 0:
        raise InvalidArgument("page_size must not be negative", reason=Reason.INVALID_PAGE_SIZE)
    return min(asked or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def _mac(payload: bytes) -> bytes:
    return hmac.new(_KEY, payload, hashlib.sha256).digest()[:_MAC_BYTES]


def encode_token(last_key: str, bound_to: str = "") -> str:
    """The token of the page after `last_key`, for the filter `bound_to` (any text)."""
    payload = json.dumps([last_key, bound_to], separators=(",", ":")).encode()
    return base64url.encode(_mac(payload) + payload)


def decode_token(token: str, valid_key: Callable[[str], bool], bound_to: str = "") -> str:
    """The key after which the page starts; "" for the first page."""
    if not token:
        return ""
    value = ""
    try:
        raw = base64url.decode(token)
        mac, payload = raw[:_MAC_BYTES], raw[_MAC_BYTES:]
        if hmac.compare_digest(mac, _mac(payload)):
            key, bound = json.loads(payload)
            if isinstance(key, str) and bound == bound_to:
                value = key
    except (ValueError, UnicodeDecodeError, TypeError):
        value = ""
    if not value or not valid_key(value):
        raise InvalidArgument(
            "page_token is not one this server issued for this list and filter (tokens do "
            "not survive a server restart: list again from the first page)",
            reason=Reason.INVALID_PAGE_TOKEN,
        )
    return value


def page(
    items: Sequence[T],
    key: Callable[[T], str],
    size: int,
    token: str,
    bound_to: str,
) -> tuple[list[T], str]:
    """One page of `items` (sorted by `key`, keys unique) after the token's key, and the next
    token ("" on the last page). For lists held whole in memory (processes, a listing)."""
    after = decode_token(token, lambda _: True, bound_to)
    rest = [item for item in items if key(item) > after] if after else list(items)
    taken = rest[:size]
    more = len(rest) > size
    return taken, encode_token(key(taken[-1]), bound_to) if more and taken else ""
