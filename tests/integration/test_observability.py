"""What an operator watches without setting anything: metrics on loopback by default (build
info, engine up, calls in flight, lease expiries, sweeps), one access-log line per RPC, and
OpenTelemetry traces exported over OTLP when a collector is configured, continuing the caller's
`traceparent` into child spans of the engine and agent calls."""

from __future__ import annotations

import json
import re
import secrets
import socket
import threading
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from conftest import (
    ServerProcess,
    make_stubs,
    own_server,
    remove_owned_containers,
    start_server,
    wait_until,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from sandboxd.config import Config
from sandboxd.v1 import admin_pb2, common_pb2, process_pb2, session_pb2

_METRICS_RE = re.compile(r"metrics served at http://(\S+):(\d+)/metrics")


def _scrape(server: ServerProcess) -> str:
    found = _METRICS_RE.search(server.log())
    assert found, server.log()
    with urllib.request.urlopen(f"http://127.0.0.1:{found.group(2)}/metrics", timeout=10) as r:
        return str(r.read().decode())


def test_metrics_are_served_on_loopback_by_default() -> None:
    metrics = Config().metrics
    assert metrics.listen == "127.0.0.1:9464" and metrics.served
    assert Config(metrics_listen="off").metrics.served is False


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace collector on loopback that keeps what it is sent."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, bytes, bytes, bytes]] = []  # name, trace, span, parent
        self.lock = threading.Lock()

    def Export(  # noqa: N802 (the RPC's name)
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self.lock:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        self.spans.append(
                            (span.name, span.trace_id, span.span_id, span.parent_span_id)
                        )
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[_Collector, int]]:
    sink = _Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield sink, port
    server.stop(0)


@pytest.fixture(scope="module")
def watched(
    tmp_path_factory: pytest.TempPathFactory, collector: tuple[_Collector, int]
) -> Iterator[ServerProcess]:
    owner = "obs" + secrets.token_hex(4)
    with own_server(
        tmp_path_factory.mktemp("observed"),
        owner,
        "--otlp-endpoint",
        f"http://127.0.0.1:{collector[1]}",
        env={"OTEL_BSP_SCHEDULE_DELAY": "200"},  # export within a fraction of a second
    ) as srv:
        yield srv


def _session(stubs: object) -> str:
    created = stubs.sessions.CreateSession(  # type: ignore[attr-defined]
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True)), timeout=60
    )
    return str(created.session.session_id)


def test_build_info_engine_up_and_in_flight_calls(watched: ServerProcess) -> None:
    text = _scrape(watched)
    assert re.search(r'^sandboxd_build_info\{.*version="[^"]+".*\} 1\.0$', text, re.M), text
    assert re.search(r"^sandboxd_engine_up 1\.0$", text, re.M)
    for action in ("delete", "suspend", "snapshot"):
        assert f'sandboxd_lease_expiries_total{{action="{action}"}}' in text
    for kind in ("containers", "images", "networks", "sessions"):
        assert f'sandboxd_swept_total{{kind="{kind}"}}' in text
    stubs = make_stubs(watched.address)
    try:
        sid = _session(stubs)
        # A Run in flight while the scrape happens is counted as one.
        call = stubs.processes.Run.future(
            process_pb2.RunRequest(session_id=sid, argv=["sleep", "3"]), timeout=30
        )
        assert wait_until(
            lambda: 'sandboxd_rpc_in_flight{method="ProcessService/Run"} 1.0' in _scrape(watched),
            timeout=10,
        )
        call.result()
        assert 'sandboxd_rpc_in_flight{method="ProcessService/Run"} 0.0' in _scrape(watched)
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
    finally:
        stubs.channel.close()


def test_one_access_log_line_per_rpc(watched: ServerProcess) -> None:
    stubs = make_stubs(watched.address)
    try:
        sid = _session(stubs)
        stubs.processes.Run(process_pb2.RunRequest(session_id=sid, argv=["true"]), timeout=30)
        with pytest.raises(grpc.RpcError):
            stubs.processes.Run(process_pb2.RunRequest(session_id="no-such", argv=["true"]))
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
    finally:
        stubs.channel.close()

    def access_lines() -> list[dict[str, object]]:
        lines = [json.loads(x) for x in watched.log().splitlines() if x.startswith("{")]
        return [x for x in lines if x.get("logger") == "sandboxd.access"]

    assert wait_until(lambda: any(x.get("code") == "NOT_FOUND" for x in access_lines()))
    runs = [x for x in access_lines() if x["rpc"] == "ProcessService/Run"]
    ok = [x for x in runs if x.get("session_id") == sid]
    assert ok and ok[0]["code"] == "OK" and ok[0]["level"] == "INFO"
    assert ok[0]["tenant"] and float(str(ok[0]["duration_ms"])) >= 0
    assert any(x["code"] == "NOT_FOUND" and x.get("session_id") == "no-such" for x in runs)


def test_spans_continue_the_callers_trace_into_engine_and_agent_calls(
    watched: ServerProcess, collector: tuple[_Collector, int]
) -> None:
    sink = collector[0]
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    traced = (("traceparent", f"00-{trace_id}-{parent}-01"),)
    stubs = make_stubs(watched.address)
    try:
        created = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True)),
            metadata=traced,
            timeout=60,
        )
        sid = created.session.session_id
        stubs.processes.Run(
            process_pb2.RunRequest(session_id=sid, argv=["true"]), metadata=traced, timeout=30
        )
        stubs.admin.GetServerInfo(admin_pb2.GetServerInfoRequest())
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
    finally:
        stubs.channel.close()
    want = bytes.fromhex(trace_id)

    def ours() -> list[tuple[str, bytes, bytes, bytes]]:
        with sink.lock:
            return [s for s in sink.spans if s[1] == want]

    assert wait_until(
        lambda: (
            {"sandboxd.v1.SessionService/CreateSession", "sandboxd.v1.ProcessService/Run"}
            <= {s[0] for s in ours()}
        ),
        timeout=20,
    ), sink.spans
    spans = ours()
    rpc = {s[0]: s for s in spans}
    create, run = (
        rpc["sandboxd.v1.SessionService/CreateSession"],
        rpc["sandboxd.v1.ProcessService/Run"],
    )
    assert create[3] == bytes.fromhex(parent) and run[3] == bytes.fromhex(parent)
    parents = {s[2]: s[3] for s in spans}

    def under(span: tuple[str, bytes, bytes, bytes], ancestor: bytes) -> bool:
        seen, at = 0, span[3]
        while at and seen < 50:
            if at == ancestor:
                return True
            at, seen = parents.get(at, b""), seen + 1
        return False

    shown = [(s[0], s[2].hex(), s[3].hex()) for s in spans]
    assert any(s[0] == "engine.create_sandbox" and under(s, create[2]) for s in spans), shown
    assert any(s[0].startswith("agent.") and under(s, run[2]) for s in spans), shown
    # A call without a traceparent starts a trace of its own.
    assert wait_until(
        lambda: any(s[0] == "sandboxd.v1.AdminService/GetServerInfo" for s in sink.spans)
    )
    (info,) = [s for s in sink.spans if s[0] == "sandboxd.v1.AdminService/GetServerInfo"]
    assert info[1] != want and info[3] == b""


def test_a_taken_default_metrics_port_is_a_warning_not_a_stop(tmp_path: Path) -> None:
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 9464))
    except OSError:
        pass  # taken already by someone else: the case under test either way
    holder.listen(1)
    owner = "obsport" + secrets.token_hex(4)
    srv = start_server(tmp_path, owner, "--metrics-listen", "127.0.0.1:9464")
    try:
        assert "metrics not served: 127.0.0.1:9464 is taken" in srv.log()
        stubs = make_stubs(srv.address)
        stubs.admin.GetServerInfo(admin_pb2.GetServerInfoRequest(), timeout=10)
        stubs.channel.close()
    finally:
        holder.close()
        srv.stop()
        remove_owned_containers(owner)
