"""Prometheus metrics on their own port, and the JSON log lines that carry session ids."""

from __future__ import annotations

import json
import logging
import re
import secrets
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import (
    HELPER,
    ServerProcess,
    Stubs,
    make_stubs,
    remove_owned_containers,
    run,
    start_server,
    wait_until,
)
from sandboxd.config import load_config
from sandboxd.errors import ConfigError
from sandboxd.logging_setup import CURRENT_SESSION, JsonFormatter
from sandboxd.v1 import common_pb2, session_pb2, snapshot_pb2, snapshot_pb2_grpc

_METRICS_RE = re.compile(r"metrics served at http://(\S+):(\d+)/metrics")


def scrape(server: ServerProcess) -> str:
    m = _METRICS_RE.search(server.log())
    assert m, server.log()
    assert m.group(1) == "127.0.0.1"
    with urllib.request.urlopen(f"http://127.0.0.1:{m.group(2)}/metrics", timeout=10) as resp:
        assert resp.status == 200
        return str(resp.read().decode())


def value(text: str, sample: str) -> float:
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    assert found, f"{sample} not in metrics:\n{text}"
    return float(found.group(1))


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Stubs]]:
    owner = "metr" + secrets.token_hex(4)
    srv = start_server(tmp_path_factory.mktemp("metrics"), owner, "--metrics-listen", "127.0.0.1:0")
    stubs = make_stubs(srv.address)
    yield srv, stubs
    stubs.channel.close()
    srv.stop()
    remove_owned_containers(owner)


def test_metrics_count_sessions_rpcs_and_output(observed: tuple[ServerProcess, Stubs]) -> None:
    srv, stubs = observed
    s = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
    ).session
    assert run(stubs, s.session_id, "sh", "-c", "printf 12345; printf abc >&2").exit_code == 0
    with pytest.raises(grpc.RpcError):
        stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id="no-such-session"))

    missing = (
        'sandboxd_rpc_duration_seconds_count{code="NOT_FOUND",method="SessionService/GetSession"}'
    )
    # A call is counted as its handler ends, which may be a moment after its caller has the
    # answer (seen once in CI under load): wait for the count rather than race it.
    assert wait_until(lambda: f"\n{missing} " in scrape(srv), timeout=10)
    assert value(scrape(srv), missing) >= 1
    text = scrape(srv)
    assert value(text, 'sandboxd_sessions{state="RUNNING"}') >= 1
    create = 'sandboxd_rpc_duration_seconds_count{code="OK",method="SessionService/CreateSession"}'
    assert value(text, create) >= 1
    assert value(text, 'sandboxd_exec_output_bytes_total{stream="stdout"}') >= 5
    assert value(text, 'sandboxd_exec_output_bytes_total{stream="stderr"}') >= 3
    assert value(text, "sandboxd_pool_available") == 0
    assert 'sandboxd_engine_errors_total{kind="unavailable"}' in text
    assert value(text, "process_resident_memory_bytes") > 0

    stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=s.session_id))
    assert wait_until(
        lambda: value(scrape(srv), 'sandboxd_sessions{state="RUNNING"}') == 0, timeout=10
    )


def test_server_logs_are_json_lines_with_session_ids(
    observed: tuple[ServerProcess, Stubs],
) -> None:
    srv, stubs = observed
    s = stubs.sessions.CreateSession(session_pb2.CreateSessionRequest()).session
    stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=s.session_id))

    def mine() -> set[str]:
        records = [json.loads(line) for line in list(srv.log_lines) if line.strip()]
        for r in records:
            assert {"time", "level", "logger", "message"} <= set(r), r
        return {r["message"] for r in records if r.get("session_id") == s.session_id}

    # This session's own line (an earlier test's "session deleted" may be in the log already,
    # and the line is read from the server's output by a thread of the fixture).
    assert wait_until(lambda: "session deleted" in mine()), mine()
    assert "session created" in mine()


def test_text_log_format(tmp_path: Path) -> None:
    owner = "text" + secrets.token_hex(4)
    srv = start_server(tmp_path, owner, "--log-format", "text")
    try:
        first = srv.log_lines[0]
        assert not first.startswith("{") and " INFO " in first, first
    finally:
        srv.stop()
        remove_owned_containers(owner)


@pytest.mark.parametrize(
    ("flags", "setting"),
    [
        (["--log-format", "xml"], "log_format"),
        (["--pool-size", "-1"], "pool_size"),
        (["--pool-size", "many"], "pool_size"),
        (["--metrics-listen", "9464"], "metrics_listen"),
    ],
)
def test_invalid_observability_settings(flags: list[str], setting: str) -> None:
    with pytest.raises(ConfigError, match=setting):
        load_config(["--helper", str(HELPER), *flags], env={})


def test_json_formatter_carries_extras_and_tracebacks() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("t").makeRecord(
            "t",
            logging.ERROR,
            __file__,
            1,
            "failed %s",
            ("here",),
            exc_info=sys.exc_info(),
            extra={"session_id": "s-1"},
        )
    doc = json.loads(JsonFormatter().format(record))
    assert doc["message"] == "failed here"
    assert doc["level"] == "ERROR" and doc["logger"] == "t"
    assert doc["session_id"] == "s-1"
    assert "ValueError: boom" in doc["exc_info"]


def test_json_lines_name_the_session_of_the_call_being_served() -> None:
    record = logging.getLogger("t").makeRecord("t", logging.INFO, __file__, 1, "m", (), None)
    assert "session_id" not in json.loads(JsonFormatter().format(record))
    token = CURRENT_SESSION.set("s-42")
    try:
        assert json.loads(JsonFormatter().format(record))["session_id"] == "s-42"
    finally:
        CURRENT_SESSION.reset(token)


def test_metrics_count_archive_bytes(observed: tuple[ServerProcess, Stubs]) -> None:
    srv, stubs = observed
    s = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            shell=common_pb2.ShellPolicy(allow_all=True),
            workspace=session_pb2.WorkspaceManifest(
                files=[session_pb2.ManifestFile(path="f", content=b"x" * 5000)]
            ),
        )
    ).session
    snapshots = snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)
    try:
        before = scrape(srv)
        exported = b"".join(
            r.chunk.data
            for r in snapshots.ExportArchive(
                snapshot_pb2.ExportArchiveRequest(session_id=s.session_id)
            )
        )
        requests = [
            snapshot_pb2.ImportArchiveRequest(
                header=snapshot_pb2.ImportArchiveHeader(session_id=s.session_id, path="copy")
            ),
            snapshot_pb2.ImportArchiveRequest(data=exported),
        ]
        snapshots.ImportArchive(iter(requests))
        after = scrape(srv)
        for direction in ("export", "import"):
            sample = f'sandboxd_archive_bytes_total{{direction="{direction}"}}'
            assert value(after, sample) - value(before, sample) == len(exported)
    finally:
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=s.session_id))


def test_proxy_decisions_are_counted_once_per_verdict() -> None:
    from sandboxd.egress.audit import AuditLog
    from sandboxd.metrics import Metrics

    metrics = Metrics()
    audit = AuditLog("s1", on_decision=metrics.proxy_decision)
    audit.record(method="CONNECT", host="a.example", port=443, allowed=True)
    audit.record(method="CONNECT", host="b.example", port=443, allowed=False, reason="X")
    audit.record(method="CONNECT", host="a.example", port=443, allowed=True, ended="closed")
    text = metrics.render().decode()
    assert value(text, 'sandboxd_proxy_decisions_total{decision="allow"}') == 1
    assert value(text, 'sandboxd_proxy_decisions_total{decision="deny"}') == 1
