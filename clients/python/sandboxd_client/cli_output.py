"""sandboxctl's output: text for people, JSON (`-o json`) for programs."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when a command runs: the parser needs none of them
    pass


def pairs(values: Sequence[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"sandboxctl: {what} must be KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def wants_json(args: argparse.Namespace) -> bool:
    return bool(args.output == "json" or getattr(args, "json", False))


def emit(args: argparse.Namespace, value: Any, text: Callable[[], str] | str) -> None:
    """One result: JSON with `-o json`, else the command's own text form."""
    from sandboxd_client.models import as_dict

    if wants_json(args):
        print(json.dumps(as_dict(value), indent=2, sort_keys=True))
    else:
        out = text() if callable(text) else text
        if out:
            print(out)


def table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def when(value: Any) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value is not None else "-"


# ---- sessions ----------------------------------------------------------------------------------
