"""The one page-token codec of the API's List calls (sessions, snapshots).

A token is the URL-safe base64 of the last key of the page; what the key may be is checked by
the caller's validator, so a token forged or from another list is INVALID_PAGE_TOKEN.
"""

from __future__ import annotations

import base64
from collections.abc import Callable

from sandboxd.errors import InvalidArgument

MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100


def page_size(asked: int) -> int:
    """The page size to serve: the default for 0, capped at the maximum."""
    if asked < 0:
        raise InvalidArgument("page_size must not be negative", reason="INVALID_PAGE_SIZE")
    return min(asked or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def encode_token(last_key: str) -> str:
    return base64.urlsafe_b64encode(last_key.encode()).decode()


def decode_token(token: str, valid_key: Callable[[str], bool]) -> str:
    """The key after which the page starts; "" for the first page."""
    if not token:
        return ""
    try:
        value = base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        value = ""
    if not value or not valid_key(value):
        raise InvalidArgument(
            "page_token is not one this server issued", reason="INVALID_PAGE_TOKEN"
        )
    return value
