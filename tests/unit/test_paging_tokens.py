"""The page-token codec (paging.py): tokens are opaque, signed, and bound to the
filter that made them; `page` walks a sorted list exactly once."""

from __future__ import annotations

import base64

import pytest
from sandboxd import paging
from sandboxd.errors import InvalidArgument


def _any(_: str) -> bool:
    return True


def test_a_token_round_trips_for_its_own_filter_only() -> None:
    token = paging.encode_token("s-123", "sessions env=prod")
    assert "s-123" not in token  # not the key in clear base64 either
    assert paging.decode_token(token, _any, "sessions env=prod") == "s-123"
    with pytest.raises(InvalidArgument) as exc:
        paging.decode_token(token, _any, "sessions env=dev")
    assert exc.value.reason == "INVALID_PAGE_TOKEN"
    assert paging.decode_token("", _any, "anything") == ""


@pytest.mark.parametrize(
    "forged",
    [
        base64.urlsafe_b64encode(b"s-123").decode(),  # the old, unsigned format
        "!!!",
        "A" * 10_000,
        base64.urlsafe_b64encode(b"\0" * 16 + b'["s-9",""]').decode(),
    ],
)
def test_forged_or_edited_tokens_are_refused(forged: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        paging.decode_token(forged, _any)
    assert exc.value.reason == "INVALID_PAGE_TOKEN"


def test_an_edited_token_is_refused() -> None:
    token = paging.encode_token("p-1", "processes s")
    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    raw[-3] ^= 1
    edited = base64.urlsafe_b64encode(bytes(raw)).decode()
    with pytest.raises(InvalidArgument):
        paging.decode_token(edited, _any, "processes s")


def test_the_key_validator_still_applies() -> None:
    token = paging.encode_token("not an id")
    with pytest.raises(InvalidArgument):
        paging.decode_token(token, lambda k: k.startswith("s-"))


def test_page_walks_every_item_once() -> None:
    items = [f"k{i:03d}" for i in range(25)]
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        got, token = paging.page(items, lambda k: k, 10, token, "f")
        seen += got
        pages += 1
        if not token:
            break
    assert seen == items and pages == 3
    assert paging.page(items, lambda k: k, 25, "", "f") == (items, "")
    assert paging.page([], lambda k: k, 5, "", "f") == ([], "")
    with pytest.raises(InvalidArgument):
        paging.page(items, lambda k: k, 10, paging.encode_token("k005", "other"), "f")
