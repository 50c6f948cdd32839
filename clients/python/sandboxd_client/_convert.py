"""Conversions between protobuf values and the client's plain ones."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.message import Message


def enum_name(enum: Any, value: int, prefix: str) -> str:
    """A proto enum value's short name; an unknown (newer) value shows as its number."""
    try:
        name: str = enum.Name(value)
    except ValueError:
        return str(value)
    return name.removeprefix(prefix)


def enum_value(enum: Any, name: str, prefix: str) -> Any:
    """The proto enum value of a short name ("" is the UNSPECIFIED zero)."""
    if not name:
        return 0
    try:
        value = enum.Value(prefix + name.upper().removeprefix(prefix))
    except ValueError:
        raise ValueError(f"{name!r} is not one of {sorted(enum.keys())}") from None
    return value


def seconds(d: duration_pb2.Duration) -> float:
    return float(d.seconds) + d.nanos / 1e9


def duration(value: float | None) -> duration_pb2.Duration | None:
    if value is None:
        return None
    d = duration_pb2.Duration()
    d.FromTimedelta(dt.timedelta(seconds=value))
    return d


def timestamp(msg: Message, name: str) -> dt.datetime | None:
    if not msg.HasField(name):
        return None
    ts: timestamp_pb2.Timestamp = getattr(msg, name)
    return ts.ToDatetime(tzinfo=dt.UTC)


def as_dict(value: Any) -> Any:
    """JSON-ready form of a result (datetimes as ISO 8601 text, bytes as UTF-8 or repr)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: as_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if hasattr(value, "kind_name"):
            out = {"kind": value.kind_name, **out}
        return out
    if isinstance(value, dt.datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: as_dict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_dict(v) for v in value]
    return value
