"""What an error carries besides its code and message, in AIP-193 form, decided here once.

ErrorInfo metadata keys: the service's errors name their metadata in snake_case with units in
the value ("maximum": "600s"), as v1 always sent them. AIP-193 wants lowerCamelCase keys with
the unit in the key ("maximumSeconds": "600"). Renaming them would change what v1 clients
read, so every key is sent both ways while v1 lasts: the old key (deprecated) and its
lowerCamelCase twin, a seconds value ("600s") moving its unit into the key. Clients should
read the lowerCamelCase keys.

RetryInfo: a retryable reason (errors.proto marks them) also gets a google.rpc.RetryInfo with
the delay to wait, beside the deprecated `retry` metadata some errors still carry.
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
    }
)
RETRY_DELAY_S = 1
_SECONDS = re.compile(r"\A(\d+(?:\.\d+)?)s\Z")


def camel(key: str) -> str:
    first, *rest = key.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


def metadata(md: Mapping[str, str]) -> dict[str, str]:
    """The metadata with each snake_case key's lowerCamelCase twin (units in the key)."""
    out = dict(md)
    for key, value in md.items():
        twin, seconds = camel(key), _SECONDS.match(value)
        if seconds:
            twin, value = twin + "Seconds", seconds.group(1)
        if twin != key and twin not in out:
            out[twin] = value
    return out


def retry_info(reason: str) -> error_details_pb2.RetryInfo | None:
    if reason not in RETRYABLE:
        return None
    return error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=RETRY_DELAY_S))
