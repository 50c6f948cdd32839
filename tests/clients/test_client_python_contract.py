"""The Python client's contract without a sandboxd: its surface against the service
descriptors, its error vocabulary against errors.proto, its retries and its version check
against stand-in gRPC servers on loopback (a real grpc.aio server, the client's own stubs)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
import sandboxd_client
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from sandboxd.tools.genproto import reason_docs
from sandboxd_client import RetryPolicy, SandboxClient, errors
from sandboxd_client._gen import reasons
from sandboxd_client._gen.sandboxd.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    audit_pb2,
    errors_pb2,
    filesystem_pb2,
    process_pb2,
    process_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    snapshot_pb2,
    template_pb2,
    volumes_pb2,
)
from sandboxd_client._gen.sandboxd.v1 import (
    admin_pb2 as _admin,
)
from sandboxd_client._rpc import IDEMPOTENT
from sandboxd_client.interaction import Interaction
from sandboxd_client.session import Session

FILES = (
    admin_pb2,
    audit_pb2,
    filesystem_pb2,
    process_pb2,
    session_pb2,
    snapshot_pb2,
    template_pb2,
    volumes_pb2,
)


def _all_rpcs() -> set[str]:
    return {
        f"{service.full_name}/{method.name}"
        for module in FILES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def _wrapped() -> dict[str, str]:
    found: dict[str, str] = {}
    for cls in (SandboxClient, Session, Interaction):
        for name, member in inspect.getmembers(cls):
            full = getattr(member, "__sandboxd_rpc__", None)
            if full is not None:
                assert full not in found, f"{full} wrapped twice: {found[full]} and {name}"
                found[full] = f"{cls.__name__}.{name}"
    return found


def test_every_rpc_of_every_service_has_a_wrapper() -> None:
    rpcs = _all_rpcs()
    assert len(rpcs) >= 31
    wrapped = _wrapped()
    assert set(wrapped) == rpcs, (
        f"not wrapped: {sorted(rpcs - set(wrapped))}; unknown: {sorted(set(wrapped) - rpcs)}"
    )


def test_streams_are_async_iterators_and_unary_calls_coroutines() -> None:
    by_rpc = {
        f"{s.full_name}/{m.name}": m
        for module in FILES
        for s in module.DESCRIPTOR.services_by_name.values()
        for m in s.methods
    }
    for full, where in _wrapped().items():
        method = by_rpc[full]
        cls_name, name = where.split(".")
        fn = getattr({"SandboxClient": SandboxClient, "Session": Session}[cls_name], name)
        if method.server_streaming and not method.client_streaming:
            assert inspect.isasyncgenfunction(fn), where
        elif not method.server_streaming and "next_page_token" in method.output_type.fields_by_name:
            assert inspect.isasyncgenfunction(fn), f"{where}: pages are followed as it iterates"
        elif not method.server_streaming:
            assert inspect.iscoroutinefunction(fn), where


def test_idempotent_methods_exist_and_retry_only_on_unavailable() -> None:
    assert IDEMPOTENT <= _all_rpcs()
    for never in ("ProcessService/Exec", "ProcessService/Run", "ProcessService/StartProcess"):
        assert f"sandboxd.v1.{never}" not in IDEMPOTENT
    config = json.loads(RetryPolicy().service_config())
    (method_config,) = config["methodConfig"]
    names = {f"{n['service']}/{n['method']}" for n in method_config["name"]}
    assert names == set(IDEMPOTENT)
    assert method_config["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]


def test_backoff_is_exponential_with_full_jitter() -> None:
    policy = RetryPolicy(initial_backoff=0.1, max_backoff=1.0, multiplier=2)
    for attempt, cap in ((0, 0.1), (1, 0.2), (3, 0.8), (6, 1.0)):
        samples = [policy.backoff(attempt) for _ in range(300)]
        assert all(0 <= s <= cap for s in samples)
        assert max(samples) > cap * 0.8 and min(samples) < cap * 0.2  # spread, not fixed
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=6)


def test_the_client_reason_enum_is_errors_proto() -> None:
    proto = {n.removeprefix("ERROR_REASON_") for n in errors_pb2.ErrorReason.keys()}
    assert {r.value for r in errors.Reason} == proto - {"UNSPECIFIED"}
    docs = {d.name: d for d in reason_docs()}
    assert reasons.CODE == {n: d.code for n, d in docs.items()}
    assert reasons.RETRYABLE == {n for n, d in docs.items() if d.retryable}


def test_each_reason_family_class_stands_for_the_reasons_one_code() -> None:
    for reason, cls in errors.BY_REASON.items():
        assert cls.code.name == reasons.CODE[reason], reason
    for reason, code in reasons.CODE.items():
        assert issubclass(errors.BY_CODE[grpc.StatusCode[code]], errors.SandboxError), reason


# ---- stand-in servers ---------------------------------------------------------------------------


def _status(code: grpc.StatusCode, message: str, reason: str = "") -> grpc.Status:
    details = []
    if reason:
        info = error_details_pb2.ErrorInfo(reason=reason, domain="sandboxd")
        detail = any_pb2.Any()
        detail.Pack(info)
        details.append(detail)
    return rpc_status.to_status(
        status_pb2.Status(code=code.value[0], message=message, details=details)
    )


class StandIn:
    """Admin, Session and Process services that fail their first `fail` calls as told."""

    def __init__(self, api_version: str = "v1") -> None:
        self.api_version = api_version
        self.calls: dict[str, int] = {}
        self.failures: dict[str, list[grpc.Status]] = {}

    async def _maybe_fail(self, name: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        queue = self.failures.get(name)
        if queue:
            await context.abort_with_status(queue.pop(0))


def _servicers(stand_in: StandIn) -> list[tuple[Callable[..., None], Any]]:
    class Admin(admin_pb2_grpc.AdminServiceServicer):
        async def GetServerInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
            await stand_in._maybe_fail("GetServerInfo", context)
            return _admin.GetServerInfoResponse(
                version="stand-in", api_version=stand_in.api_version
            )

    class Sessions(session_pb2_grpc.SessionServiceServicer):
        async def GetSession(self, request: Any, context: Any) -> Any:  # noqa: N802
            await stand_in._maybe_fail("GetSession", context)
            return session_pb2.GetSessionResponse(
                session=session_pb2.Session(session_id=request.session_id, state=2)
            )

        async def CreateSession(self, request: Any, context: Any) -> Any:  # noqa: N802
            await stand_in._maybe_fail("CreateSession", context)
            return session_pb2.CreateSessionResponse(
                session=session_pb2.Session(session_id=request.session_id or "made", state=2)
            )

    class Processes(process_pb2_grpc.ProcessServiceServicer):
        async def Run(self, request: Any, context: Any) -> Any:  # noqa: N802
            await stand_in._maybe_fail("Run", context)
            return process_pb2.RunResponse(exit_code=0)

    return [
        (admin_pb2_grpc.add_AdminServiceServicer_to_server, Admin()),
        (session_pb2_grpc.add_SessionServiceServicer_to_server, Sessions()),
        (process_pb2_grpc.add_ProcessServiceServicer_to_server, Processes()),
    ]


async def _serve(stand_in: StandIn | None) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    if stand_in is not None:
        for add, servicer in _servicers(stand_in):
            add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def stand_in() -> AsyncIterator[tuple[StandIn, str]]:
    s = StandIn()
    server, address = await _serve(s)
    yield s, address
    await server.stop(None)


FAST = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05)
UNAVAILABLE = _status(grpc.StatusCode.UNAVAILABLE, "engine down", "ENGINE_UNAVAILABLE")


async def test_idempotent_call_retries_unavailable_through_grpc(
    stand_in: tuple[StandIn, str],
) -> None:
    s, address = stand_in
    s.failures["GetSession"] = [UNAVAILABLE, UNAVAILABLE]
    async with SandboxClient(address, retry=FAST, timeout=10) as c:
        assert (await c.get_session("a")).id == "a"
    assert s.calls["GetSession"] == 3


async def test_retryable_reason_of_another_code_is_retried_by_the_client(
    stand_in: tuple[StandIn, str],
) -> None:
    s, address = stand_in
    conflict = _status(grpc.StatusCode.FAILED_PRECONDITION, "busy", "ENGINE_CONFLICT")
    s.failures["GetSession"] = [conflict, conflict]
    async with SandboxClient(address, retry=FAST, timeout=10) as c:
        assert (await c.get_session("a")).id == "a"
    assert s.calls["GetSession"] == 3


async def test_a_non_idempotent_call_is_never_retried(stand_in: tuple[StandIn, str]) -> None:
    s, address = stand_in
    s.failures["Run"] = [UNAVAILABLE, UNAVAILABLE]
    s.failures["CreateSession"] = [UNAVAILABLE]
    async with SandboxClient(address, retry=FAST, timeout=10) as c:
        with pytest.raises(errors.EngineUnavailable) as exc:
            await c.session("a").run(["true"])
        assert exc.value.retryable and exc.value.reason == "ENGINE_UNAVAILABLE"
        with pytest.raises(errors.EngineUnavailable):
            await c.create_session(allow=["sh"])  # no caller-chosen id: not idempotent
    assert s.calls["Run"] == 1 and s.calls["CreateSession"] == 1


async def test_create_session_with_an_id_is_retried(stand_in: tuple[StandIn, str]) -> None:
    s, address = stand_in
    s.failures["CreateSession"] = [UNAVAILABLE, UNAVAILABLE]
    async with SandboxClient(address, retry=FAST, timeout=10) as c:
        assert (await c.create_session(session_id="mine")).id == "mine"
    assert s.calls["CreateSession"] == 3


async def test_non_retryable_errors_and_disabled_retries(stand_in: tuple[StandIn, str]) -> None:
    s, address = stand_in
    s.failures["GetSession"] = [
        _status(grpc.StatusCode.NOT_FOUND, "no", "SESSION_NOT_FOUND"),
        UNAVAILABLE,
    ]
    async with SandboxClient(address, retry=FAST, timeout=10) as c:
        with pytest.raises(errors.SessionNotFound) as exc:
            await c.get_session("a")
        assert not exc.value.retryable
    async with SandboxClient(address, retry=None, timeout=10) as c:
        with pytest.raises(errors.EngineUnavailable):
            await c.get_session("a")
    assert s.calls["GetSession"] == 2


@pytest.mark.serial  # a wall-clock bound of a few seconds: run alone
async def test_retries_stop_at_the_deadline(stand_in: tuple[StandIn, str]) -> None:
    s, address = stand_in
    s.failures["CreateSession"] = [UNAVAILABLE] * 100
    slow = RetryPolicy(max_attempts=5, initial_backoff=0.3, max_backoff=1.0)
    async with SandboxClient(address, retry=slow) as c:
        await c.server_info()
        started = time.monotonic()
        with pytest.raises(errors.SandboxError) as exc:
            await c.create_session(session_id="mine", timeout=0.5)
        assert time.monotonic() - started < 0.7
    # The last refusal (retryable), or, when the deadline ran out inside an attempt rather than
    # between two (a loaded machine), the deadline itself: either way no retry outlived it.
    assert exc.value.retryable or isinstance(exc.value, errors.DeadlineExceeded), exc.value


# ---- compatibility ------------------------------------------------------------------------------


async def test_a_server_of_another_major_version_is_refused_before_any_call() -> None:
    s = StandIn(api_version="v2")
    server, address = await _serve(s)
    try:
        async with SandboxClient(address, timeout=5) as c:
            with pytest.raises(errors.IncompatibleServer) as exc:
                await c.get_session("a")
            assert "v2" in exc.value.message and "v1" in exc.value.message
            assert exc.value.reason == "INCOMPATIBLE_API_VERSION" and not exc.value.retryable
    finally:
        await server.stop(None)
    assert "GetSession" not in s.calls


async def test_a_server_of_a_newer_minor_version_is_accepted() -> None:
    s = StandIn(api_version="v1.4")
    server, address = await _serve(s)
    try:
        async with SandboxClient(address, timeout=5) as c:
            assert (await c.get_session("a")).id == "a"
            assert (await c.get_session("b")).id == "b"
    finally:
        await server.stop(None)
    assert s.calls["GetServerInfo"] == 1  # checked once, on first use


async def test_a_grpc_server_that_is_not_sandboxd() -> None:
    server, address = await _serve(None)  # answers gRPC, serves nothing of ours
    try:
        async with SandboxClient(address, timeout=5) as c:
            with pytest.raises(errors.NotSandboxd) as exc:
                await c.create_session(allow=["sh"])
    finally:
        await server.stop(None)
    assert address in exc.value.message and "sandboxd" in exc.value.message
    assert isinstance(exc.value, errors.IncompatibleServer) and "\n" not in exc.value.message


@pytest.mark.serial  # a wall-clock bound of a few seconds: run alone
async def test_a_closed_port_fails_fast_and_typed() -> None:
    started = time.monotonic()
    async with SandboxClient("127.0.0.1:1", timeout=3) as c:
        with pytest.raises(errors.ServerUnreachable) as exc:
            await c.get_session("a")
    assert time.monotonic() - started < 3.5
    assert "127.0.0.1:1" in exc.value.message and "\n" not in exc.value.message


class Listener:
    """A TCP server that accepts and never speaks gRPC (optionally sends `reply`)."""

    def __init__(self, reply: bytes = b"") -> None:
        self.reply = reply
        self.held: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.held.append(writer)
        if self.reply:
            writer.write(self.reply)
            await writer.drain()
            writer.close()

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.held:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        await self.server.wait_closed()


@pytest.mark.serial  # a wall-clock bound of a few seconds: run alone
@pytest.mark.parametrize("timeout", [1.0, None])
async def test_a_silent_peer_never_hangs_past_the_deadline(timeout: float | None) -> None:
    async with Listener() as address:
        started = time.monotonic()
        async with SandboxClient(address, timeout=timeout, connect_timeout=1.5) as c:
            with pytest.raises(errors.SandboxError) as exc:
                await c.get_session("a")
        assert time.monotonic() - started < 2.5
        assert isinstance(exc.value, errors.DeadlineExceeded | errors.ServerUnreachable)


@pytest.mark.serial  # a wall-clock bound of a few seconds: run alone
async def test_an_http1_server_is_a_typed_error() -> None:
    async with Listener(b"HTTP/1.1 400 Bad Request\r\n\r\n") as address:
        started = time.monotonic()
        async with SandboxClient(address, timeout=3) as c:
            with pytest.raises(errors.SandboxError) as exc:
                await c.server_info()
        assert time.monotonic() - started < 3.5
        assert "\n" not in exc.value.message and len(exc.value.message) < 400


def test_the_package_does_not_import_the_server() -> None:
    import subprocess
    import sys

    code = (
        "import sys, sandboxd_client, sandboxd_client.cli; "
        "print([m for m in sys.modules if m == 'sandboxd' or m.startswith('sandboxd.')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert sandboxd_client.__version__


async def test_an_engine_outage_at_the_check_does_not_block_the_call(
    stand_in: tuple[StandIn, str],
) -> None:
    """sandboxd without its engine cannot report its version; the call still goes ahead."""
    s, address = stand_in
    s.failures["GetServerInfo"] = [UNAVAILABLE] * 4
    async with SandboxClient(address, retry=FAST, timeout=10) as c:
        assert (await c.get_session("a")).id == "a"
        assert (await c.get_session("b")).id == "b"  # checked again: the engine is back
    assert s.calls["GetServerInfo"] == 5 and s.calls["GetSession"] == 2


def test_no_public_method_or_result_type_exposes_protobuf() -> None:
    import dataclasses

    from sandboxd_client import events, models

    for cls in (SandboxClient, Session, Interaction):
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_"):
                annotation = str(inspect.signature(fn).return_annotation)
                assert "pb2" not in annotation and "Message" not in annotation, (name, annotation)
    for module in (models, events):
        for _, value in inspect.getmembers(module, dataclasses.is_dataclass):
            for f in dataclasses.fields(value):
                assert "pb2" not in str(f.type), (value, f.name)


def _rpc_error(status: grpc.Status) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        status.code,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*status.trailing_metadata),
        details=status.details,
    )


def test_error_decoding_reads_only_sandboxd_error_info() -> None:
    exc = errors.from_rpc_error(
        _rpc_error(_status(grpc.StatusCode.NOT_FOUND, "gone", "SESSION_NOT_FOUND")), "h:1"
    )
    assert type(exc) is errors.SessionNotFound and exc.message == "gone"
    # a family class is used only with the code it stands for
    odd = errors.from_rpc_error(
        _rpc_error(_status(grpc.StatusCode.UNAVAILABLE, "rebuilt", "CONTAINER_LOST")), "h:1"
    )
    assert type(odd) is errors.Unavailable and odd.retryable and odd.reason == "CONTAINER_LOST"
    # another domain's ErrorInfo is not ours: the code decides, the reason is the code's name
    info = error_details_pb2.ErrorInfo(reason="QUOTA", domain="example.com")
    detail = any_pb2.Any()
    detail.Pack(info)
    foreign = rpc_status.to_status(
        status_pb2.Status(
            code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], message="x", details=[detail]
        )
    )
    other = errors.from_rpc_error(_rpc_error(foreign), "h:1")
    assert type(other) is errors.ResourceExhausted and other.reason == "RESOURCE_EXHAUSTED"
    # metadata retry=true marks an error retryable whatever its code
    marked = errors.SandboxError("m", reason="X", metadata={"retry": "true"})
    assert marked.retryable
