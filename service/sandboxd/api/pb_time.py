"""Times and spans as a reply carries them: a clock's seconds since the epoch, a datetime and
a span in seconds as google.protobuf Timestamp and Duration, built one way for every message
(the converters of each service used to build their own)."""

from __future__ import annotations

from datetime import datetime

from google.protobuf import duration_pb2, timestamp_pb2


def timestamp_pb(ns: int) -> timestamp_pb2.Timestamp:
    """Nanoseconds since the epoch."""
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(ns)
    return ts


def time_pb(seconds: float) -> timestamp_pb2.Timestamp:
    """Seconds since the epoch, as `time.time()` gives them."""
    return timestamp_pb(int(seconds * 1e9))


def datetime_pb(when: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(when)
    return ts


def duration_pb(seconds: float) -> duration_pb2.Duration:
    """A span in seconds, to the nearest nanosecond."""
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(round(seconds * 1e9)))
    return d
