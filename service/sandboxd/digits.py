"""Decimal numbers read from text someone else wrote: a header, an agent's answer, a query
string, a JSON string field, a setting.

`str.isdigit()` is true for characters `int()` refuses (the superscripts ¹ ² ³, which a header
decoded as latin-1 carries as single bytes), and `int()` takes digits of every script,
underscores and surrounding blanks. A parser built on either answers a hostile value with a
stray ValueError (a 500, a dropped connection) where it should refuse it, or accepts a value the
next hop reads differently. Here a number is ASCII 0-9 and nothing else.
"""

from __future__ import annotations


def decimal(text: str, max_digits: int = 19) -> int | None:
    """The value of `text` when it is 1 to `max_digits` ASCII digits; None for anything else
    (the caller says what was wrong, in its own protocol's words)."""
    if not 0 < len(text) <= max_digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)
