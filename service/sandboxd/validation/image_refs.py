"""The spelling of image references and of allowlist patterns (pure).

Below the allowlist (`sandboxd.images`) and the tokens file (`sandboxd.tokens`), which both
parse patterns with it, and the configuration's checks, which parse `image_allowlist`.

Patterns: `*` matches any run of characters but `@` (so `/` and `:` too; a digest must be
written out); nothing else is special. References and patterns are compared in their normal
form: `docker.io/library/` and `docker.io/` dropped, `:latest` added to a reference with
neither tag nor digest.
"""

from __future__ import annotations

import re

__all__ = ["normalize_reference", "parse_patterns"]

_PATTERN_RE = re.compile(r"\A[a-z0-9*][a-z0-9._:/@*-]{0,254}\Z")


def _strip_registry(ref: str) -> str:
    for prefix in ("docker.io/library/", "index.docker.io/library/", "docker.io/"):
        if ref.startswith(prefix):
            return ref[len(prefix) :]
    return ref


def normalize_reference(ref: str) -> str:
    """The one spelling of a reference: no default registry, an explicit tag."""
    ref = _strip_registry(ref)
    if "@" in ref:
        return ref
    last = ref.rsplit("/", 1)[-1]
    return ref if ":" in last else ref + ":latest"


def parse_patterns(text: str) -> tuple[str, ...]:
    """`pattern,pattern,...` -> normalized patterns; ValueError names a bad one."""
    patterns = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        if not _PATTERN_RE.match(item):
            raise ValueError(
                f"{item[:100]!r} is not an image pattern (lowercase reference, '*' as wildcard)"
            )
        patterns.append(normalize_reference(item) if "*" not in item else _strip_registry(item))
    return tuple(patterns)
