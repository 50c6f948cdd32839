"""What an audit event is, and what a listing asks for."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

# The kinds of API.md "Additions to v1" (AuditService): a listing may filter by these only.
KINDS = frozenset(
    {
        "command",
        "file_write",
        "file_remove",
        "archive_import",
        "archive_export",
        "snapshot",
        "egress",
        "preview",
        "secret_injected",
        "secret_misdirected",
        "lifecycle",
        "refused",
    }
)

MAX_ATTRIBUTE_CHARS = 4096  # an argv or path longer than this is cut (marked with a suffix)


def _clip(value: object) -> str:
    # The common scalars spelled as json.dumps spells them, without its call (a command's
    # record has half a dozen: codes, flags, byte counts).
    kind = type(value)
    text: str
    if isinstance(value, str) and kind is str:
        text = value
    elif kind is bool:
        text = "true" if value else "false"
    elif isinstance(value, int) and kind is int:
        text = int.__repr__(value)
    else:
        text = json.dumps(value)
    if len(text) > MAX_ATTRIBUTE_CHARS:
        return text[:MAX_ATTRIBUTE_CHARS] + "...(cut)"
    return text


@dataclass(frozen=True)
class AuditEvent:
    """One audited action; `id` is assigned by the store (0 until written)."""

    time: float
    tenant: str
    session_id: str
    kind: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    trace_id: str = ""
    id: int = 0

    @classmethod
    def of(
        cls,
        kind: str,
        *,
        time: float,
        tenant: str,
        session_id: str = "",
        trace_id: str = "",
        **attributes: object,
    ) -> AuditEvent:
        """Attributes of any JSON-able type, stored as strings (lists and numbers as JSON)."""
        attrs = {k: _clip(v) for k, v in attributes.items() if v is not None}
        return cls(time, tenant, session_id, kind, attrs, trace_id)

    def to_json(self) -> str:
        """The export line: one JSON object, keys as in the API's AuditEvent."""
        return json.dumps(
            {
                "id": str(self.id),
                "time": self.time,
                "tenant": self.tenant,
                "session_id": self.session_id,
                "kind": self.kind,
                "attributes": dict(self.attributes),
                "trace_id": self.trace_id,
            },
            separators=(",", ":"),
        )


@dataclass(frozen=True)
class AuditQuery:
    """A ListAuditEvents page: `tenant` is already the tenant the caller may read."""

    tenant: str
    session_id: str = ""
    kinds: frozenset[str] = frozenset()
    start_time: float | None = None
    end_time: float | None = None
    after_id: int = 0
    limit: int = 100
