"""One API vocabulary, read from the service descriptors rather than a kept list:
every List pages (AIP-158), every duration is a google.protobuf.Duration, every size ends in
`_bytes`, new timestamps end in `_time`. A field that broke a rule before the rule existed is
kept for compatibility only if it is marked deprecated and has its conforming twin; the
frozen sets below can only shrink."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor

PROTO_DIR = Path(__file__).resolve().parents[2] / "proto" / "sandboxd" / "v1"
INTEGER_TYPES = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SINT64,
}
DURATION_SUFFIXES = ("_seconds", "_secs", "_ms", "_minutes", "_nanos")
# Timestamps named before AIP-142 was adopted; new ones end in `_time`.
OLD_TIMESTAMPS = {
    "sandboxd.v1.FileInfo.modified_at",
    "sandboxd.v1.Process.started_at",
    "sandboxd.v1.Session.created_at",
    "sandboxd.v1.Session.lease_expires_at",
    "sandboxd.v1.Snapshot.created_at",
    "sandboxd.v1.EgressEvent.time",
    "sandboxd.v1.Preview.expires_at",  # named by API.md's "Additions to v1" contract
    "sandboxd.v1.Volume.created_at",  # named by API.md's "Additions to v1" contract
}


def _files() -> Iterator[object]:
    pool = descriptor_pool.Default()
    for proto in sorted(PROTO_DIR.glob("*.proto")):
        importlib.import_module(f"sandboxd.v1.{proto.stem}_pb2")
        yield pool.FindFileByName(f"sandboxd/v1/{proto.name}")


def _messages() -> Iterator[Descriptor]:
    def walk(m: Descriptor) -> Iterator[Descriptor]:
        yield m
        for nested in m.nested_types:
            if not nested.GetOptions().map_entry:
                yield from walk(nested)

    for fd in _files():
        for m in fd.message_types_by_name.values():  # type: ignore[attr-defined]
            yield from walk(m)


def _fields() -> Iterator[FieldDescriptor]:
    for m in _messages():
        yield from m.fields


def _deprecated(f: FieldDescriptor) -> bool:
    return bool(f.GetOptions().deprecated)


def _is_size(f: FieldDescriptor) -> bool:
    name = f.name
    if f.type not in INTEGER_TYPES or name == "page_size":
        return False
    return (
        name in ("size", "bytes", "length_bytes")
        or name.endswith("_size")
        or "bytes_" in name
        or (name.endswith("bytes") and not name.endswith("_bytes"))
    )


def test_every_list_rpc_pages() -> None:
    lists = []
    for fd in _files():
        for service in fd.services_by_name.values():  # type: ignore[attr-defined]
            for method in service.methods:
                if not method.name.startswith("List"):
                    continue
                lists.append(method.name)
                request, response = method.input_type, method.output_type
                for name in ("page_size", "page_token"):
                    assert name in request.fields_by_name, f"{method.full_name}: no {name}"
                assert "next_page_token" in response.fields_by_name, method.full_name
    assert {"ListSessions", "ListProcesses", "ListDir", "ListSnapshots"} <= set(lists)


def test_every_duration_is_a_duration() -> None:
    for f in _fields():
        if f.type in INTEGER_TYPES and f.name.endswith(DURATION_SUFFIXES):
            assert _deprecated(f), f"{f.full_name}: a duration as an integer; use Duration"
            twin = f.name.rsplit("_", 1)[0]
            twin_field = f.containing_type.fields_by_name.get(twin)
            assert twin_field is not None, f"{f.full_name}: no Duration twin `{twin}`"
            assert twin_field.message_type.full_name == "google.protobuf.Duration", twin


def test_every_size_ends_in_bytes() -> None:
    for f in _fields():
        if _is_size(f):
            assert _deprecated(f), f"{f.full_name}: a size not named *_bytes"
            fields = f.containing_type.fields_by_name
            twins = [n for n in fields if n.endswith("_bytes") and fields[n].number >= 120]
            assert twins, f"{f.full_name}: deprecated without a *_bytes twin"


def test_new_timestamps_end_in_time() -> None:
    for f in _fields():
        if f.message_type is not None and f.message_type.full_name == "google.protobuf.Timestamp":
            # `time` alone is AIP-142's name for an event's own moment (API.md's AuditEvent and
            # SessionEvent use it).
            if f.name == "time" or f.name.endswith("_time") or f.full_name in OLD_TIMESTAMPS:
                continue
            twin = f.name.removesuffix("_at") + "_time"
            assert _deprecated(f) and twin in f.containing_type.fields_by_name, f.full_name


def test_one_name_for_making_parents() -> None:
    for f in _fields():
        if f.name == "parents":
            assert _deprecated(f), f"{f.full_name}: call it make_parents"
            assert "make_parents" in f.containing_type.fields_by_name, f.full_name


def test_the_rules_see_what_they_judge() -> None:
    """The scans are not vacuous: they find the old fields they allow."""
    sizes = {f.full_name for f in _fields() if _is_size(f)}
    assert "sandboxd.v1.FileInfo.size" in sizes
    durations = {
        f.full_name
        for f in _fields()
        if f.type in INTEGER_TYPES and f.name.endswith(DURATION_SUFFIXES)
    }
    assert "sandboxd.v1.GetServerInfoResponse.lease_max_seconds" in durations
