"""Every numeric, enum and duration field of every request, at its extremes.

The fields are found by walking the request messages of every RPC of every service module in
sandboxd.v1 (nested messages and Timestamps included), so a field or a service added later is
covered without a new test. Each one is set, on an otherwise valid request, to 0, -1, the
smallest and largest value of its type; an enum to values it does not define; a Duration also
to the largest ones (315576000000 s, with and without nanos) and malformed ones (mixed signs,
nanos out of range). The answer must be INVALID_ARGUMENT or OK (the value was clamped to a
documented maximum): never UNKNOWN or INTERNAL, and never a hang. After each case the walk's
session must still be RUNNING with its records readable, and the bystander still answer (the
guard): a value that passes the check and breaks a later step fails the case that sent it.

The walk runs twice: on the suite's server, and on one whose duration maxima are the largest
Duration (an operator's "no limit"), where a caller's 10,000-year lease is accepted and must
come back as a lease the server can compute with, not an OverflowError. A hypothesis property
does the same with values drawn from each type's whole range.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import sandboxd.v1
from conftest import (
    ServerProcess,
    Stubs,
    delete_volumes,
    make_stubs,
    remove_owned_containers,
    start_server,
    wait_until,
)
from google.protobuf import descriptor, message, message_factory
from google.protobuf.descriptor import FieldDescriptor as FD
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sandboxd.v1 import common_pb2, process_pb2, session_pb2

pytestmark = pytest.mark.usefixtures("guard")

# Every module of the API that defines a service: one added later is walked too.
MODULES = tuple(
    module
    for module in (
        importlib.import_module(f"sandboxd.v1.{info.name}")
        for info in pkgutil.iter_modules(sandboxd.v1.__path__)
        if info.name.endswith("_pb2")
    )
    if module.DESCRIPTOR.services_by_name
)
DURATION = "google.protobuf.Duration"
MAX_DURATION_S = 315_576_000_000
MAX_NANOS = 999_999_999
CALL_TIMEOUT_S = 60

_RANGES = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
    FD.TYPE_FIXED64: (0, 2**64 - 1),
}
_FLOATS = (FD.TYPE_DOUBLE, FD.TYPE_FLOAT)
INT32 = (-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class Field:
    """One numeric or Duration field reachable from an RPC's request message."""

    service: str
    method: descriptor.MethodDescriptor
    path: tuple[str, ...]
    field: descriptor.FieldDescriptor

    @property
    def is_duration(self) -> bool:
        return self.field.type == FD.TYPE_MESSAGE

    def __str__(self) -> str:
        return f"{self.method.name}.{'.'.join(self.path)}"


def _walk(
    md: descriptor.Descriptor, prefix: tuple[str, ...], seen: frozenset[str]
) -> Iterator[tuple[tuple[str, ...], descriptor.FieldDescriptor]]:
    for f in md.fields:
        path = (*prefix, f.name)
        if f.type in _RANGES or f.type in _FLOATS or f.type == FD.TYPE_ENUM:
            yield path, f
        elif f.type == FD.TYPE_MESSAGE:
            sub = f.message_type
            if sub.full_name == DURATION:
                yield path, f
            elif not sub.GetOptions().map_entry and sub.full_name not in seen:
                yield from _walk(sub, path, seen | {sub.full_name})


def request_fields() -> list[Field]:
    fields = []
    for module in MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                for path, f in _walk(method.input_type, (), frozenset()):
                    fields.append(Field(service.full_name, method, path, f))
    return fields


FIELDS = request_fields()


def extremes(f: Field) -> list[Any]:
    if f.is_duration:
        return [
            (0, 0),
            (-1, 0),
            (0, -1),
            (MAX_DURATION_S, 0),  # the largest whole one: at most an open maximum
            (MAX_DURATION_S, MAX_NANOS),
            (-MAX_DURATION_S, -MAX_NANOS),
            (1, -1),  # mixed signs: not a valid Duration
            (0, 10**9),  # nanos out of range
            (2**63 - 1, 0),  # beyond the Duration range
        ]
    if f.field.type in _FLOATS:
        return [0.0, -1.0, 1e308, float("inf"), float("nan")]
    if f.field.type == FD.TYPE_ENUM:
        # Only values the enum does not define (an open enum carries any int32): a defined
        # one is a valid choice, and some (a pull policy of ALWAYS) would reach out.
        unknown = max(v.number for v in f.field.enum_type.values) + 1
        return [-1, unknown, *INT32]
    low, high = _RANGES[f.field.type]
    return sorted({0, 1, -1 if low < 0 else 0, low, high, high // 2 + 1})


# --------------------------------------------------------------------------------------------
# Valid requests to put one extreme value into
# --------------------------------------------------------------------------------------------


@dataclass
class Context:
    stubs: Stubs
    session_id: str
    process_id: str
    lease_session_id: str = ""

    def lease_session(self) -> str:
        """A session for RenewLease alone: a valid ttl of a nanosecond ends it, so it is made
        again whenever it has gone, and the walk's other requests keep theirs."""
        with contextlib.suppress(grpc.RpcError):
            got = self.stubs.sessions.GetSession(
                session_pb2.GetSessionRequest(session_id=self.lease_session_id), timeout=10
            )
            if got.session.state == session_pb2.SESSION_STATE_RUNNING:
                return self.lease_session_id
        self.lease_session_id = self.stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow=["true"]))
        ).session.session_id
        return self.lease_session_id

    def assert_still_serves(self, after: str) -> None:
        """The follow-up of every case: the walk's session is still RUNNING and its process
        records still load, so a value accepted and broken on a later step (a timer, the
        reaper, a record the next read cannot load) fails the case that sent it. (The guard
        runs a command in the bystander; one here would make the records the walk reads
        give way to new ones.)"""
        got = self.stubs.sessions.GetSession(
            session_pb2.GetSessionRequest(session_id=self.session_id), timeout=10
        )
        assert got.session.state == session_pb2.SESSION_STATE_RUNNING, after
        listed = self.stubs.processes.ListProcesses(
            process_pb2.ListProcessesRequest(session_id=self.session_id), timeout=10
        )
        assert any(p.process_id == self.process_id for p in listed.processes), after


ALLOWLIST = {
    "mode": common_pb2.NETWORK_MODE_ALLOWLIST,
    "allowed_domains": ["example.com"],
    "allowed_ports": [443],
}


def _base(method: str, path: tuple[str, ...], ctx: Context) -> dict[str, Any]:
    """Field values that make `method`'s request valid; the field under test then changes."""
    sid = {"session_id": ctx.session_id}
    argv = {**sid, "argv": ["true"]}
    bases: dict[str, dict[str, Any]] = {
        "WriteFile": {**sid, "path": "fields/f", "content": b"x", "make_parents": True},
        "ListDir": {**sid, "path": "."},
        "Exec": argv,
        "Run": argv,
        "StartProcess": argv,
        "AttachProcess": {**sid, "process_id": ctx.process_id},
        "RenewLease": {"session_id": ctx.lease_session()},
        "ListEgressEvents": sid,
        "UpdateNetworkPolicy": {**sid, "network": ALLOWLIST},
        "CreateSession": {
            "shell": {"allow_all": True},
            "workspace": {"files": [{"path": "f", "content": b"x", "mode": 0o644}]},
            # Network fields count only with an allowlist; other cases skip the bridge.
            **({"network": ALLOWLIST} if path[0] == "network" else {}),
        },
    }
    return bases.get(method, {})


def _fill(msg: message.Message, values: dict[str, Any]) -> None:
    for name, value in values.items():
        fd = msg.DESCRIPTOR.fields_by_name[name]
        target = getattr(msg, name)
        if (
            fd.type == FD.TYPE_MESSAGE
            and fd.is_repeated
            and not fd.message_type.GetOptions().map_entry
        ):
            for item in value:
                _fill(target.add(), item)
        elif fd.type == FD.TYPE_MESSAGE and not fd.is_repeated:
            target.SetInParent()
            _fill(target, value)
        elif fd.is_repeated:
            target.extend(value)
        else:
            setattr(msg, name, value)


def _set(msg: message.Message, path: tuple[str, ...], value: Any) -> None:
    """Set the field at `path`, creating (or using the first of) the messages on the way."""
    for name in path[:-1]:
        fd = msg.DESCRIPTOR.fields_by_name[name]
        if fd.is_repeated:
            container = getattr(msg, name)
            msg = container[0] if len(container) else container.add()
        else:
            msg = getattr(msg, name)
            msg.SetInParent()
    fd = msg.DESCRIPTOR.fields_by_name[path[-1]]
    if fd.type == FD.TYPE_MESSAGE:  # a Duration
        d = getattr(msg, path[-1])
        d.seconds, d.nanos = value
        d.SetInParent()
    elif fd.is_repeated:
        container = getattr(msg, path[-1])
        del container[:]
        container.append(value)
    else:
        setattr(msg, path[-1], value)


def _requests(f: Field, value: Any, ctx: Context) -> list[message.Message]:
    cls = message_factory.GetMessageClass(f.method.input_type)
    if f.method.name == "Interact":
        # The first message starts a command on a terminal; a later one may resize it while
        # it runs.
        start = cls()
        argv = ["true"] if f.path[0] == "start" else ["sleep", "2"]
        _fill(start.start.request, {"session_id": ctx.session_id, "argv": argv})
        _fill(start.start.pty, {"rows": 24, "cols": 80})
        if f.path[0] == "start":
            _set(start, f.path, value)
            return [start]
        later = cls()
        getattr(later, f.path[0]).SetInParent()
        if f.path[0] == "resize":
            _fill(later.resize, {"rows": 24, "cols": 80})
        _set(later, f.path, value)
        return [start, later]
    msg = cls()
    _fill(msg, _base(f.method.name, f.path, ctx))
    _set(msg, f.path, value)
    return [msg]


WATCH_S = 2.0  # how long a watch RPC is held open before the caller leaves


def call(ctx: Context, f: Field, value: Any) -> tuple[grpc.StatusCode, Any]:
    """Send the request(s); the status code and, on success, the (last) response."""
    method = f.method
    name = f"/{f.service}/{method.name}"
    out_cls = message_factory.GetMessageClass(method.output_type)
    kw: dict[str, Callable[..., Any]] = {
        "request_serializer": lambda m: m.SerializeToString(),
        "response_deserializer": out_cls.FromString,
    }
    reqs = _requests(f, value, ctx)
    channel = ctx.stubs.channel
    last = None
    try:
        if method.client_streaming and method.server_streaming:
            for last in channel.stream_stream(name, **kw)(iter(reqs), timeout=CALL_TIMEOUT_S):  # noqa: B007
                pass
        elif method.client_streaming:
            last = channel.stream_unary(name, **kw)(iter(reqs), timeout=CALL_TIMEOUT_S)
        elif method.server_streaming and method.name.startswith("Watch"):
            # A watch is live until the caller leaves: accepted is OK, and it must keep
            # answering (not fail) for as long as the caller stays.
            try:
                for last in channel.unary_stream(name, **kw)(reqs[0], timeout=WATCH_S):  # noqa: B007
                    pass
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
                    raise
        elif method.server_streaming:
            for last in channel.unary_stream(name, **kw)(reqs[0], timeout=CALL_TIMEOUT_S):  # noqa: B007
                pass
        else:
            last = channel.unary_unary(name, **kw)(reqs[0], timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as err:
        return err.code(), err.details()  # type: ignore[attr-defined]
    return grpc.StatusCode.OK, last


def malformed(duration: tuple[int, int]) -> bool:
    """Outside what google.protobuf.Duration defines: range, nanos, one sign for both."""
    seconds, nanos = duration
    return (
        abs(seconds) > MAX_DURATION_S
        or abs(nanos) > MAX_NANOS
        or (seconds > 0 > nanos)
        or (seconds < 0 < nanos)
    )


# Answers the API documents for a field beside INVALID_ARGUMENT (API.md, process.proto).
DOCUMENTED = {
    "AttachProcess.stdout_offset": grpc.StatusCode.OUT_OF_RANGE,  # past the end of the output
    "AttachProcess.stderr_offset": grpc.StatusCode.OUT_OF_RANGE,
    # A valid port or lifetime on this suite's server, which serves no previews: PREVIEWS_DISABLED
    # (a bad one is still INVALID_ARGUMENT: checked before whether previews are served).
    "PublishPort.port": grpc.StatusCode.FAILED_PRECONDITION,
    "PublishPort.ttl": grpc.StatusCode.FAILED_PRECONDITION,
    "PublishPort.public": grpc.StatusCode.FAILED_PRECONDITION,
}


def check(ctx: Context, f: Field, value: Any) -> None:
    code, detail = call(ctx, f, value)
    if code == grpc.StatusCode.OK and f.method.name == "CreateSession":
        with contextlib.suppress(grpc.RpcError):
            ctx.stubs.sessions.DeleteSession(
                session_pb2.DeleteSessionRequest(session_id=detail.session.session_id)
            )
    allowed = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, DOCUMENTED.get(str(f))}
    if f.is_duration and malformed(value):
        allowed = {grpc.StatusCode.INVALID_ARGUMENT}  # never read as some other value
    assert code in allowed, (
        f"{f} = {value!r}: {code.name} {detail if code != grpc.StatusCode.OK else ''}"
    )
    ctx.assert_still_serves(f"after {f} = {value!r} ({code.name})")


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


# The largest Duration protobuf allows: what an operator writes for "no limit". Every duration
# maximum of the second server is set to it, so that a caller's duration is accepted up to the
# top of the range and every later step (a lease's end as a clock time, a command's deadline,
# the reaper) meets it; the default server refuses such values before they reach anything.
OPEN_MAXIMA = (
    "--max-command-timeout-s",
    f"{MAX_DURATION_S}s",
    "--lease-max-s",
    f"{MAX_DURATION_S}s",
)


@pytest.fixture(scope="module", params=["default-maxima", "open-maxima"])
def server(
    request: pytest.FixtureRequest,
    server: ServerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    """The suite's server, then one whose duration maxima are the largest Duration."""
    if request.param == "default-maxima":
        yield server
        return
    owner = "test" + secrets.token_hex(4)
    srv = start_server(tmp_path_factory.mktemp("open"), owner, *OPEN_MAXIMA)
    try:
        yield srv
    finally:
        delete_volumes(srv)
        srv.stop()
        remove_owned_containers(owner)


@pytest.fixture(scope="module")
def stubs(server: ServerProcess) -> Iterator[Stubs]:
    made = make_stubs(server.address)
    yield made
    made.channel.close()


@pytest.fixture(scope="module")
def ctx(stubs: Stubs) -> Iterator[Context]:
    # An allowlist session, so that UpdateNetworkPolicy's fields are read.
    sid = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            shell=common_pb2.ShellPolicy(allow_all=True),
            network=common_pb2.NetworkPolicy(**ALLOWLIST),  # type: ignore[arg-type]
        )
    ).session.session_id
    pid = stubs.processes.StartProcess(
        process_pb2.StartProcessRequest(session_id=sid, argv=["echo", "done"])
    ).process.process_id

    def exited() -> bool:
        got = stubs.processes.ListProcesses(process_pb2.ListProcessesRequest(session_id=sid))
        return any(p.process_id == pid and p.HasField("exited") for p in got.processes)

    assert wait_until(exited, timeout=15)
    made = Context(stubs, sid, pid)
    yield made
    for each in (sid, made.lease_session_id):
        with contextlib.suppress(grpc.RpcError):
            stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=each))


def test_the_walk_finds_the_known_fields() -> None:
    """The walk reaches nested, repeated and oneof fields (it would pass vacuously otherwise)."""
    names = {str(f) for f in FIELDS}
    assert {
        "CreateSession.limits.memory_bytes",
        "CreateSession.lease_ttl",
        "CreateSession.network.quotas.idle_timeout",
        "CreateSession.network.allowed_ports",
        "CreateSession.workspace.files.mode",
        "Run.timeout",
        "Interact.resize.rows",
        "AttachProcess.stdout_offset",
        "ListSessions.page_size",
        "RenewLease.ttl",
    } <= names


CASES = [(f, v) for f in FIELDS for v in extremes(f)]


@pytest.mark.parametrize(("field", "value"), CASES, ids=[f"{f}={v}" for f, v in CASES])
def test_every_field_at_its_extremes(ctx: Context, field: Field, value: Any) -> None:
    check(ctx, field, value)


def _values(f: Field) -> st.SearchStrategy[Any]:
    if f.is_duration:
        return st.tuples(
            st.integers(-MAX_DURATION_S, MAX_DURATION_S), st.integers(-MAX_NANOS, MAX_NANOS)
        )
    if f.field.type in _FLOATS:
        return st.floats(allow_nan=True, allow_infinity=True)
    if f.field.type == FD.TYPE_ENUM:
        defined = {v.number for v in f.field.enum_type.values}
        return st.integers(*INT32).filter(lambda v: v not in defined)
    low, high = _RANGES[f.field.type]
    return st.integers(low, high)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_field_over_its_whole_range(ctx: Context, data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(FIELDS), label="field")
    check(ctx, field, data.draw(_values(field), label=str(field)))
