"""Numbers a caller asks for, held to the operator's maxima (a session's limits, its disk's
size, its egress proxy's quotas): one refusal for a value above its maximum, so every such
limit is refused in the same words, with the same reason and metadata."""

from __future__ import annotations

from typing import TypeVar

from sandboxd.errors import InvalidArgument
from sandboxd.reasons import Reason

N = TypeVar("N", int, float)


def at_most(value: N, maximum: N, *, name: str, limit: str = "") -> N:
    """`value` if it is at most `maximum`; above it, INVALID_ARGUMENT LIMIT_EXCEEDS_MAXIMUM
    naming the field as the caller spells it (`name`), with the maximum and the field's key
    (`limit`, `name` unless given) in the metadata."""
    if value > maximum:
        raise InvalidArgument(
            f"{name} = {value} is above the server maximum {maximum}",
            reason=Reason.LIMIT_EXCEEDS_MAXIMUM,
            metadata={"limit": limit or name, "maximum": str(maximum)},
        )
    return value
