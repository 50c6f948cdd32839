"""One error vocabulary: the proto's ErrorReason, the server's Reason, the codes and docs/errors.md.

The call-site scan reads the service's source (not a hand-kept list), so a reason added anywhere
in service/ without its ErrorReason value, or sent with a second gRPC code, fails here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from sandboxd import errors
from sandboxd.api.errors import STATUS_BY_ERROR, status_code_for, to_status
from sandboxd.reasons import Reason
from sandboxd.tools.genproto import ERRORS_DOC, REASON_PREFIX, doc_with_table, reason_docs
from sandboxd.v1 import errors_pb2

SERVICE = Path(errors.__file__).parent
DOCS = {d.name: d for d in reason_docs()}

# Sites that still send a reason with a second code, each with the fix the merge applies.
# The test fails when one is fixed, so this list can only shrink.
KNOWN_SECOND_CODES: set[tuple[str, str]] = set()


def _proto_names() -> set[str]:
    names = set(errors_pb2.ErrorReason.keys())
    assert all(n.startswith(REASON_PREFIX) for n in names)
    return {n.removeprefix(REASON_PREFIX) for n in names} - {"UNSPECIFIED"}


def test_reason_enum_equals_the_proto_enum_both_ways() -> None:
    ours = {r.name for r in Reason}
    assert ours == _proto_names()
    assert all(r.value == r.name for r in Reason), "a Reason's value is its bare name"


def test_every_reason_declares_exactly_one_valid_grpc_code() -> None:
    assert set(DOCS) == _proto_names()
    valid = {c.name for c in grpc.StatusCode} - {"OK"}
    for d in DOCS.values():
        assert d.code in valid, f"{d.name}: {d.code} is not a gRPC status code"
        assert d.meaning.strip(), d.name
        if d.code == "UNAVAILABLE":
            assert d.retryable, f"{d.name}: UNAVAILABLE is retryable by definition"


def test_error_table_is_generated_from_the_enum() -> None:
    doc = ERRORS_DOC.read_text()
    assert doc == doc_with_table(doc, list(DOCS.values())), (
        "docs/errors.md's error table differs from errors.proto: run `make proto`"
    )


def test_the_error_table_check_fails_on_a_difference() -> None:
    doc = ERRORS_DOC.read_text()
    docs = list(DOCS.values())[:-1]
    assert doc != doc_with_table(doc, docs)


def _class_codes() -> dict[str, str]:
    """Every SandboxError subclass by name, with its one gRPC code (api/errors.py's mapping)."""
    out: dict[str, str] = {}
    stack: list[type[errors.SandboxError]] = [errors.SandboxError]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        for base, code in STATUS_BY_ERROR:
            if issubclass(cls, base):
                out[cls.__name__] = code.name
                break
        else:
            out[cls.__name__] = grpc.StatusCode.INTERNAL.name
    return out


CLASS_CODES = _class_codes()


def _reason_value(node: ast.expr | None) -> str | None:
    """A reason given as a literal or as `Reason.X`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Reason"
    ):
        return node.attr
    return None


Site = tuple[str, str | None, str]  # reason, its code when known statically, where


def _called_name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _error_classes(nodes: list[ast.AST]) -> dict[str, str]:
    """Error class names usable in this module (errors.py's and local subclasses) -> code."""
    classes = dict(CLASS_CODES)
    for node in nodes:
        if isinstance(node, ast.ClassDef) and node.name not in classes:
            for base in node.bases:
                name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
                if name in classes:
                    classes[node.name] = classes[name]
    return classes


def _sites(path: Path) -> Iterator[tuple[str, str | None, str]]:
    """(reason, code or None when not known statically, where) for every reason in one file.

    Direct constructions `SomeError(..., reason=R)`, and helpers that take a `reason`
    parameter and pass it to an error class (`_refuse(R, ...)`, `_env_error(..., R)`, with
    defaults).
    """
    tree = ast.parse(path.read_text())
    nodes = list(ast.walk(tree))  # walked once: the passes below filter it
    classes = _error_classes(nodes)
    helpers: dict[str, tuple[int, str | None, str | None]] = {}  # name -> (index, default, code)
    for fn in nodes:
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        params = [a.arg for a in fn.args.args]
        if "reason" not in params:
            continue
        code = None
        passes = False
        for call in ast.walk(fn):
            if isinstance(call, ast.Call) and _called_name(call) in classes:
                for kw in call.keywords:
                    if kw.arg == "reason" and isinstance(kw.value, ast.Name):
                        passes = kw.value.id == "reason"
                        code = classes[_called_name(call) or ""] if passes else code
        if not passes:
            continue  # not an error helper (the egress proxy's HTTP refusals)
        index = params.index("reason")
        defaults = fn.args.defaults
        first_default = len(params) - len(defaults)
        default = _reason_value(defaults[index - first_default]) if index >= first_default else None
        helpers[fn.name] = (index, default, code)
        if default is not None:
            yield default, code, f"{path.name}:{fn.lineno}"
    for call in nodes:
        if not isinstance(call, ast.Call):
            continue
        name = _called_name(call)
        where = f"{path.name}:{call.lineno}"
        if name in classes:
            for kw in call.keywords:
                value = _reason_value(kw.value) if kw.arg == "reason" else None
                if value is not None:
                    yield value, classes[name], where
        elif name in helpers:
            index, _, code = helpers[name]
            given = [_reason_value(kw.value) for kw in call.keywords if kw.arg == "reason"]
            if index < len(call.args):
                given.append(_reason_value(call.args[index]))
            for value in given:
                if value is not None:
                    yield value, code, where
    for node in nodes:  # errors.py's default reasons
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for stmt in node.body:
                target = (
                    getattr(stmt, "target", None) or (getattr(stmt, "targets", None) or [None])[0]
                )
                if isinstance(target, ast.Name) and target.id == "default_reason":
                    value = _reason_value(stmt.value)  # type: ignore[attr-defined]
                    if value is not None:
                        yield value, classes[node.name], f"{path.name}:{node.lineno}"


@pytest.fixture(scope="module")
def sites() -> list[Site]:
    """Every reason site of the service: scanned by the worker that runs these tests, not at
    each worker's collection."""
    return [
        site
        for path in sorted(SERVICE.rglob("*.py"))
        if "v1" not in path.relative_to(SERVICE).parts
        for site in _sites(path)
    ]


def test_the_scan_sees_the_reasons_the_service_sends(
    sites: list[tuple[str, str | None, str]],
) -> None:
    """The scan is not vacuous: it finds direct, helper-passed and default reasons."""
    found = {reason for reason, _, _ in sites}
    assert {"ARCHIVE_PATH_TRAVERSAL", "INVALID_ENV", "SESSION_NOT_FOUND", "TOKEN_MISSING"} <= found
    assert len(found) > 60


def test_every_reason_the_service_sends_is_in_the_enum(
    sites: list[tuple[str, str | None, str]],
) -> None:
    unknown = sorted({f"{reason} ({where})" for reason, _, where in sites if reason not in DOCS})
    assert not unknown, f"add these to ErrorReason in errors.proto and `make proto`: {unknown}"


def test_every_reason_is_sent_with_its_one_declared_code(
    sites: list[tuple[str, str | None, str]],
) -> None:
    second = {
        (reason, code)
        for reason, code, _ in sites
        if reason in DOCS and code is not None and code != DOCS[reason].code
    }
    assert second == KNOWN_SECOND_CODES, (
        "a reason is sent with a code other than errors.proto declares: "
        f"{sorted(second - KNOWN_SECOND_CODES)}; fixed: {sorted(KNOWN_SECOND_CODES - second)}"
    )


@pytest.mark.parametrize("reason", list(Reason))
def test_sandbox_error_accepts_the_enum_and_sends_the_bare_name(reason: Reason) -> None:
    exc = errors.FailedPrecondition("m", reason=reason)
    assert exc.reason == reason.name and type(exc.reason) is str
    status = to_status(exc)
    assert status.code == status_code_for(exc)
    details = dict(status.trailing_metadata)["grpc-status-details-bin"]
    assert reason.name.encode() in details


def test_default_reasons_are_enum_members() -> None:
    for name in CLASS_CODES:
        cls = getattr(errors, name, None)
        if cls is not None:
            assert isinstance(cls.default_reason, Reason), name


def test_the_scan_reads_enum_members_and_helpers_after_the_literal_replacement(
    tmp_path: Path,
) -> None:
    """Once the call sites say `Reason.X`, the scan still sees every reason and its class."""
    source = tmp_path / "sample.py"
    source.write_text(
        "from sandboxd.errors import InvalidArgument, NotFound, Unavailable\n"
        "from sandboxd.reasons import Reason\n"
        "class _Gone(NotFound):\n"
        "    pass\n"
        "def _refuse(reason: Reason, why: str) -> InvalidArgument:\n"
        "    return InvalidArgument(why, reason=reason)\n"
        "def _env(why: str, reason: Reason = Reason.INVALID_ENV) -> InvalidArgument:\n"
        "    return InvalidArgument(why, reason=reason)\n"
        "def f() -> None:\n"
        "    _refuse(Reason.ARCHIVE_PATH_TRAVERSAL, 'x')\n"
        "    _env('y', Reason.ENV_RESERVED)\n"
        "    raise _Gone('z', reason=Reason.FILE_NOT_FOUND)\n"
        "def g() -> None:\n"
        "    raise Unavailable('w', reason=Reason.CONTAINER_LOST)\n"
    )
    found = {(reason, code) for reason, code, _ in _sites(source)}
    assert found == {
        ("INVALID_ENV", "INVALID_ARGUMENT"),
        ("ARCHIVE_PATH_TRAVERSAL", "INVALID_ARGUMENT"),
        ("ENV_RESERVED", "INVALID_ARGUMENT"),
        ("FILE_NOT_FOUND", "NOT_FOUND"),
        ("CONTAINER_LOST", "UNAVAILABLE"),
    }
