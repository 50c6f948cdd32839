"""Unpadded URL-safe base64 for the tokens the server issues (page, preview, E2B access).

A token is compared, cached and logged as a string, so each must have one spelling. The
standard decoder ignores the unused low bits of a last character, which gives every token of
a length that is not a multiple of three bytes up to sixteen spellings of the same bytes; here
only the spelling `encode` makes decodes.
"""

from __future__ import annotations

import base64


def encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(text: str) -> bytes:
    """The bytes `text` spells; ValueError (binascii.Error is one) for any other spelling."""
    raw = base64.urlsafe_b64decode(text.encode() + b"=" * (-len(text) % 4))
    if encode(raw) != text:
        raise ValueError("not the one spelling of these bytes")
    return raw
