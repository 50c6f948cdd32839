"""Small text helpers shared by the validators: how a bad value is shown, UTF-8 length,
control characters."""

from __future__ import annotations

import unicodedata

_SHOW_LIMIT = 80


def _show(value: object) -> str:
    """Quote a caller value for a message, cut short so errors stay small (a value that is not
    text at all is named so, as in `_plain`)."""
    if not isinstance(value, str):
        return "<non-string>"
    if len(value) <= _SHOW_LIMIT:
        return repr(value)
    return repr(value[:_SHOW_LIMIT]) + "..."


def _plain(value: object) -> str:
    """A caller value for ErrorInfo metadata: the value itself, not quoted (a program reads
    it, and `'cat'` is not the command's name), valid UTF-8, cut short like `_show`."""
    if not isinstance(value, str):
        return "<non-string>"
    text = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return text if len(text) <= _SHOW_LIMIT else text[:_SHOW_LIMIT] + "..."


def _utf8_len(value: str) -> int | None:
    """Byte length on the wire; None for text that is not encodable (lone surrogates)."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _has_control(value: str) -> bool:
    """True for control, invisible-format or line-separator characters.

    They make names ambiguous in logs and messages (bidi overrides, zero-width joiners) and
    never belong in a command name or label value.
    """
    return any(unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp") for ch in value)
