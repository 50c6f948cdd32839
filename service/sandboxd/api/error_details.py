"""What an error carries besides its code and message, in AIP-193 form, decided here once.

ErrorInfo metadata keys: the service's errors name their metadata in snake_case with units in
the value ("maximum": "600s"), which reads well in Python. The wire follows AIP-193:
lowerCamelCase keys with the unit in the key ("maximumSeconds": "600"), each key once. Sending
both spellings (as the first v1 releases did) doubled every key a tool such as grpcurl shows and
left callers to guess which one to read.

RetryInfo: a retryable reason (errors.proto marks them) also gets a google.rpc.RetryInfo with
the delay to wait, beside the deprecated `retry` metadata some errors still carry. The delay is
the error's own `retry_after` metadata when it has one (a fair-share refusal knows when the
tenant's next token is free), else RETRY_DELAY_S.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from google.protobuf import duration_pb2
from google.rpc import error_details_pb2

from sandboxd.reasons import Reason

# Reasons errors.proto marks retryable (tests/unit/test_error_details.py keeps them equal).
RETRYABLE = frozenset(
    {
        Reason.UNAVAILABLE,
        Reason.ENGINE_UNAVAILABLE,
        Reason.ENGINE_CONFLICT,
        Reason.CONTAINER_REBUILDING,
        Reason.REGISTRY_UNREACHABLE,
        Reason.TEMPLATE_BUILDS_BUSY,
        Reason.AGENT_UNAVAILABLE,
        Reason.AGENT_RESTARTED,
        Reason.TEMPLATE_NOT_READY,
        Reason.TENANT_RATE_LIMITED,
    }
)
RETRY_DELAY_S = 1
_SECONDS = re.compile(r"\A(\d+(?:\.\d+)?)s\Z")


def camel(key: str) -> str:
    first, *rest = key.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


def metadata(md: Mapping[str, str]) -> dict[str, str]:
    """The metadata as the wire carries it: lowerCamelCase keys, a seconds unit in the key."""
    out: dict[str, str] = {}
    for key, value in md.items():
        wire, seconds = camel(key), _SECONDS.match(value)
        if seconds:
            wire, value = wire + "Seconds", seconds.group(1)
        out.setdefault(wire, value)
    return out


def retry_info(
    reason: str, md: Mapping[str, str] | None = None
) -> error_details_pb2.RetryInfo | None:
    if reason not in RETRYABLE:
        return None
    delay = duration_pb2.Duration(seconds=RETRY_DELAY_S)
    own = _SECONDS.match((md or {}).get("retry_after", ""))
    if own:
        delay.FromNanoseconds(max(1_000_000, round(float(own.group(1)) * 1e9)))  # >= 1 ms
    return error_details_pb2.RetryInfo(retry_delay=delay)
