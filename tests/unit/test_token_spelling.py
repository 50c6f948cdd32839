"""Every token the server issues opens only as the string it was issued as.

Base64's decoder ignores the unused low bits of a last character, so a token whose byte length
is not a multiple of three has other spellings that decode to the same bytes (and so to the
same valid MAC or seal). A token is compared, cached and logged as a string: each must have one
spelling, or a refusal keyed on the string (a revoked or rate-limited token) is walked around.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sandboxd import base64url
from sandboxd.errors import InvalidArgument
from sandboxd.paging import decode_token, encode_token
from sandboxd.previews.tokens import Claims, TokenSigner

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def other_spellings(text: str) -> list[str]:
    """The other last characters that decode `text` to the same bytes."""
    unused = {2: 4, 3: 2}.get(len(text) % 4, 0)  # bits of the last character that carry nothing
    last = ALPHABET.index(text[-1])
    return [
        text[:-1] + c for i, c in enumerate(ALPHABET) if i != last and i >> unused == last >> unused
    ]


@pytest.mark.parametrize("size", range(1, 10))
def test_base64url_has_one_spelling_per_bytes(size: int) -> None:
    raw = bytes(range(size))
    text = base64url.encode(raw)
    assert base64url.decode(text) == raw
    for spelling in other_spellings(text):
        with pytest.raises(ValueError):
            base64url.decode(spelling)


def test_a_page_token_has_one_spelling() -> None:
    for last_key in ("a", "ab", "abc"):  # payload lengths of each remainder mod 3
        token = encode_token(last_key, "filter")
        assert decode_token(token, lambda _: True, "filter") == last_key
        for spelling in other_spellings(token):
            with pytest.raises(InvalidArgument):
                decode_token(spelling, lambda _: True, "filter")


def test_a_preview_token_has_one_spelling(tmp_path: Path) -> None:
    signer = TokenSigner(b"k" * 32)
    seen = 0
    for tenant in ("t", "tt", "ttt"):  # payload lengths of each remainder mod 3
        token = signer.sign(Claims("s-0123456789abcdef", 8080, tenant, 1, 2e9))
        assert signer.verify(token) is not None
        body, _, mac = token.partition(".")
        for spelling in [f"{b}.{mac}" for b in other_spellings(body)] + [
            f"{body}.{m}" for m in other_spellings(mac)
        ]:
            seen += 1
            assert signer.verify(spelling) is None, spelling
    assert seen  # the lengths chosen do leave unused bits
