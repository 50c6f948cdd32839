"""Write docs/api.md, the API reference, from the comments of proto/sandboxd/v1.

`make docs` runs it. protoc itself (grpcio-tools) parses the protos into a descriptor set with
source info, so the comments are read exactly as protoc attaches them to each element, with no
parser of our own; this module only walks that set and prints Markdown. A test renders it again
and compares, so the committed reference can never drift from the protos.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path

from google.protobuf import descriptor_pb2 as d

from sandboxd.tools.paths import PROTO_ROOT, REPO

API_DOC = REPO / "docs" / "api.md"
PACKAGE = "sandboxd.v1"

# Field numbers of descriptor.proto: the source-info path of an element is made of these.
_MESSAGE, _ENUM, _SERVICE = 4, 5, 6
_FIELD, _NESTED, _NESTED_ENUM, _ONEOF = 2, 3, 4, 8
_ENUM_VALUE, _METHOD = 2, 2

_TYPE_NAMES = {
    d.FieldDescriptorProto.TYPE_DOUBLE: "double",
    d.FieldDescriptorProto.TYPE_FLOAT: "float",
    d.FieldDescriptorProto.TYPE_INT64: "int64",
    d.FieldDescriptorProto.TYPE_UINT64: "uint64",
    d.FieldDescriptorProto.TYPE_INT32: "int32",
    d.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    d.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    d.FieldDescriptorProto.TYPE_BOOL: "bool",
    d.FieldDescriptorProto.TYPE_STRING: "string",
    d.FieldDescriptorProto.TYPE_BYTES: "bytes",
    d.FieldDescriptorProto.TYPE_UINT32: "uint32",
    d.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    d.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    d.FieldDescriptorProto.TYPE_SINT32: "sint32",
    d.FieldDescriptorProto.TYPE_SINT64: "sint64",
}


def descriptor_set() -> d.FileDescriptorSet:
    """The protos as protoc parsed them, comments included (`--include_source_info`)."""
    from grpc_tools import protoc  # dev dependency: imported only when generating

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.glob("sandboxd/v1/*.proto"))
    include = str(resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", "--include_source_info"]
        if protoc.main([*args, f"--descriptor_set_out={out}", *protos]) != 0:
            raise SystemExit("protoc failed")
        return d.FileDescriptorSet.FromString(out.read_bytes())


class _Comments:
    """Leading (else trailing) comment of each element of one file, by source-info path."""

    def __init__(self, file: d.FileDescriptorProto) -> None:
        self._by_path: dict[tuple[int, ...], str] = {}
        for loc in file.source_code_info.location:
            text = loc.leading_comments or loc.trailing_comments
            if text.strip():
                self._by_path[tuple(loc.path)] = text

    def __call__(self, *path: int) -> str:
        """The comment as one paragraph: protoc keeps the line breaks of the source."""
        lines = [line.strip() for line in self._by_path.get(path, "").splitlines()]
        return " ".join(line for line in lines if line)


def _short(type_name: str) -> str:
    """`.sandboxd.v1.Session` -> `Session` (a link); other packages keep their full name."""
    name = type_name.lstrip(".")
    if name.startswith(PACKAGE + "."):
        local = name.removeprefix(PACKAGE + ".")
        return f"[`{local}`](#{_anchor(local)})"
    return f"`{name}`"


def _anchor(name: str) -> str:
    return name.lower().replace(".", "")


def _field_type(field: d.FieldDescriptorProto, maps: dict[str, d.DescriptorProto]) -> str:
    if field.type_name.lstrip(".") in maps:
        entry = maps[field.type_name.lstrip(".")]
        key, value = entry.field
        return f"map<{_field_type(key, maps)}, {_field_type(value, maps)}>"
    base = _short(field.type_name) if field.type_name else f"`{_TYPE_NAMES[field.type]}`"
    if field.label == d.FieldDescriptorProto.LABEL_REPEATED:
        return f"repeated {base}"
    if field.proto3_optional:
        return f"optional {base}"
    return base


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _message(
    out: list[str],
    msg: d.DescriptorProto,
    name: str,
    path: tuple[int, ...],
    comment: _Comments,
    maps: dict[str, d.DescriptorProto],
) -> None:
    if msg.options.map_entry:
        return
    out += [f"### {name}", ""]
    if text := comment(*path):
        out += [text, ""]
    if msg.field:
        oneofs = [o.name for o in msg.oneof_decl]
        out += ["| field | number | type | description |", "| --- | --- | --- | --- |"]
        for i, field in enumerate(msg.field):
            what = comment(*path, _FIELD, i)
            if field.HasField("oneof_index") and not field.proto3_optional:
                what = f"(one of `{oneofs[field.oneof_index]}`) {what}".strip()
            if field.options.deprecated and not what.startswith("Deprecated"):
                what = f"**Deprecated.** {what}".strip()
            kind = _field_type(field, maps)
            out.append(f"| `{field.name}` | {field.number} | {kind} | {_cell(what)} |")
        out.append("")
    for i, nested in enumerate(msg.nested_type):
        _message(out, nested, f"{name}.{nested.name}", (*path, _NESTED, i), comment, maps)
    for i, enum in enumerate(msg.enum_type):
        _enum(out, enum, f"{name}.{enum.name}", (*path, _NESTED_ENUM, i), comment)


def _enum(
    out: list[str],
    enum: d.EnumDescriptorProto,
    name: str,
    path: tuple[int, ...],
    comment: _Comments,
) -> None:
    out += [f"### {name}", ""]
    if text := comment(*path):
        out += [text, ""]
    out += ["| value | number | description |", "| --- | --- | --- |"]
    for i, value in enumerate(enum.value):
        what = _cell(comment(*path, _ENUM_VALUE, i))
        out.append(f"| `{value.name}` | {value.number} | {what} |")
    out.append("")


def _map_entries(files: Iterable[d.FileDescriptorProto]) -> dict[str, d.DescriptorProto]:
    """Every map's synthetic entry message by full name, to print `map<K, V>` for its field."""
    found: dict[str, d.DescriptorProto] = {}

    def walk(prefix: str, messages: Sequence[d.DescriptorProto]) -> None:
        for msg in messages:
            full = f"{prefix}.{msg.name}"
            if msg.options.map_entry:
                found[full] = msg
            walk(full, msg.nested_type)

    for file in files:
        walk(file.package, file.message_type)
    return found


def render(fds: d.FileDescriptorSet) -> str:
    """The whole reference: per file, its services with their RPCs, then messages and enums."""
    files = [f for f in fds.file if f.package == PACKAGE]
    maps = _map_entries(fds.file)
    out = [
        "# API reference",
        "",
        "<!-- generated by `make docs` from the comments of proto/sandboxd/v1; do not edit -->",
        "",
        f"Package `{PACKAGE}`. [api-guide.md](api-guide.md) explains what the services promise;",
        "[errors.md](errors.md) lists every error reason.",
        "",
    ]
    for file in sorted(files, key=lambda f: f.name):
        comment = _Comments(file)
        out += [f"## {file.name}", ""]
        for si, service in enumerate(file.service):
            out += [f"### {service.name}", ""]
            if text := comment(_SERVICE, si):
                out += [text, ""]
            out += ["| RPC | request | response | description |", "| --- | --- | --- | --- |"]
            for mi, method in enumerate(service.method):
                req = ("stream " if method.client_streaming else "") + _short(method.input_type)
                resp = ("stream " if method.server_streaming else "") + _short(method.output_type)
                what = _cell(comment(_SERVICE, si, _METHOD, mi))
                out.append(f"| `{method.name}` | {req} | {resp} | {what} |")
            out.append("")
        for i, msg in enumerate(file.message_type):
            _message(out, msg, msg.name, (_MESSAGE, i), comment, maps)
        for i, enum in enumerate(file.enum_type):
            _enum(out, enum, enum.name, (_ENUM, i), comment)
    return "\n".join(out).rstrip("\n") + "\n"


def main() -> None:
    API_DOC.write_text(render(descriptor_set()))
    print(f"wrote {API_DOC.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
