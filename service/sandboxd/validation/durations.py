"""Durations a caller sends: read from the wire, held to the field's rules, and clamped to what
the server can compute with.

Every duration of a request (a command's timeout, a lease, a session's command timeout, a
preview's lifetime) passes `positive_duration`, the one place that knows the three ways a
value can be wrong or too big to use:
- malformed on the wire (`duration_seconds`): outside protobuf's +-315,576,000,000 s, nanos
  of 10^9 or more, or mixed signs;
- not positive, or above the operator's maximum: INVALID_ARGUMENT with the field's reason;
- within the maximum but longer than `MAX_SPAN_S` (100 years): clamped to it. An operator may
  set a maximum as high as protobuf allows ("no limit"), yet a clock time that far ahead does
  not exist (`datetime` ends at year 9999: now plus 10,000 years raised OverflowError in
  CreateSession and RenewLease, an INTERNAL), so the span the server computes with stops here.
"""

from __future__ import annotations

import math

from sandboxd.errors import InvalidArgument
from sandboxd.reasons import Reason

# google.protobuf.Duration's own range: about +-10,000 years, nanos of the same sign.
MAX_DURATION_S = 315_576_000_000
MAX_NANOS = 999_999_999
# The longest span the server adds to a clock: 100 years (about 3.2e9 s). now + this fits a
# datetime and a Timestamp until the year 9899, and an asyncio timer or a millisecond count
# for the helper (3.2e12) holds it too.
MAX_SPAN_S = 100 * 365.25 * 86400


def duration_seconds(seconds: int, nanos: int) -> float:
    """Seconds of a wire Duration; a malformed one is the caller's mistake, never a value.

    protobuf defines a Duration only within +-315,576,000,000 s, with |nanos| below 10^9 and
    of the sign of `seconds`; a hand-built message can carry anything else, which would be
    read as some other duration (1 s and -1 ns as 0.999999999 s). Whether the value suits the
    field (positive, under a maximum) is the field's own check: `positive_duration`.
    """
    if (
        abs(seconds) > MAX_DURATION_S
        or abs(nanos) > MAX_NANOS
        or (seconds > 0 > nanos)
        or (seconds < 0 < nanos)
    ):
        raise InvalidArgument(
            f"duration {{seconds: {seconds}, nanos: {nanos}}} is not a valid "
            f"google.protobuf.Duration (|seconds| <= {MAX_DURATION_S}, |nanos| <= {MAX_NANOS}, "
            "both of one sign)",
            reason=Reason.INVALID_ARGUMENT,
        )
    return seconds + nanos / 1e9


def positive_duration(
    seconds: float,
    *,
    name: str,
    maximum: float,
    reason: str,
    metadata: dict[str, str] | None = None,
    over_reason: str = Reason.LIMIT_EXCEEDS_MAXIMUM,
) -> float:
    """`seconds` if it is positive and at most `maximum`, clamped to `MAX_SPAN_S`.

    `name` is the field as the caller spells it; `reason` is the field's own for a value that
    is not positive, `over_reason` for one above the maximum (LIMIT_EXCEEDS_MAXIMUM unless the
    field always had a reason of its own), with the maximum in the metadata. NaN and
    infinities (a float from a setting or a client) are refused too.
    """
    extra = metadata or {}
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidArgument(
            f"{name} must be positive (got {seconds:g} s)",
            reason=reason,
            metadata={"limit": name, **extra},
        )
    if seconds > maximum:
        raise InvalidArgument(
            f"{name} of {seconds:g} s is above the server maximum of {maximum:g} s",
            reason=over_reason,
            metadata={"limit": name, "maximum": f"{maximum:g}s", **extra},
        )
    return min(seconds, MAX_SPAN_S)
