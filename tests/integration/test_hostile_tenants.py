"""Hostile tenants against shared resources and 9): admin RPCs need an
admin tenant; every stream has an idle timeout on both sides; each tenant has a cap on open
streams. A bystander tenant keeps working throughout."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from authutil import authed_stubs, tenant_fixture, write_tokens
from conftest import (
    ServerProcess,
    Stubs,
    error_info,
    expect_error,
    own_server,
    run,
)
from sandboxd.v1 import admin_pb2, common_pb2, session_pb2, snapshot_pb2, snapshot_pb2_grpc

OPS = "ops-" + secrets.token_urlsafe(24)
ALPHA = "alpha-" + secrets.token_urlsafe(24)
BETA = "beta-" + secrets.token_urlsafe(24)
IDLE_S = 2.0


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("hostile-tenants")
    tokens = write_tokens(
        data / "tokens", {OPS: "ops", ALPHA: "alpha", BETA: "beta"}, {"ops": "admin"}
    )
    owner = "ht" + secrets.token_hex(4)
    with own_server(
        data / "data",
        owner,
        "--tokens-file",
        str(tokens),
        "--tenant-max-streams",
        "1",
        "--stream-idle-timeout-s",
        str(IDLE_S),
        "--max-workspace-bytes",
        "256Mi",
        "--default-workspace-bytes",
        "256Mi",
    ) as srv:
        yield srv


alpha = tenant_fixture("hostile_server", ALPHA)


beta = tenant_fixture("hostile_server", BETA)


def _session(s: Stubs) -> str:
    resp = s.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
    )
    return str(resp.session.session_id)


def _snap(s: Stubs) -> snapshot_pb2_grpc.SnapshotServiceStub:
    return snapshot_pb2_grpc.SnapshotServiceStub(s.channel)


# ---------------------------------------------------------------------------------------------
# 12.9: AdminService needs an admin tenant
# ---------------------------------------------------------------------------------------------


def test_sweep_needs_an_admin_tenant(hostile_server: ServerProcess, alpha: Stubs) -> None:
    err = expect_error(
        lambda: alpha.admin.Sweep(admin_pb2.SweepRequest(), timeout=30),
        grpc.StatusCode.PERMISSION_DENIED,
        "ADMIN_REQUIRED",
    )
    assert "admin" in err.details()  # type: ignore[attr-defined]
    # what the server enforces stays readable by every tenant (clients learn limits from it)
    assert alpha.admin.GetServerInfo(admin_pb2.GetServerInfoRequest(), timeout=30).version
    ops = authed_stubs(hostile_server.address, OPS)
    try:
        ops.admin.Sweep(admin_pb2.SweepRequest(), timeout=60)
    finally:
        ops.channel.close()


# ---------------------------------------------------------------------------------------------
# 12.7(a): idle client streams end; open streams are capped per tenant
# ---------------------------------------------------------------------------------------------


def _stalled_upload(sid: str, stop: threading.Event) -> Iterator[snapshot_pb2.ImportArchiveRequest]:
    """An ImportArchive that sends its header, then nothing until `stop` (or 60 s)."""
    yield snapshot_pb2.ImportArchiveRequest(header=snapshot_pb2.ImportArchiveHeader(session_id=sid))
    stop.wait(60)


def test_import_waiting_forever_for_data_ends(alpha: Stubs) -> None:
    sid = _session(alpha)
    try:
        stop = threading.Event()
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as excinfo:
            _snap(alpha).ImportArchive(_stalled_upload(sid, stop), timeout=30)
        stop.set()
        err = excinfo.value
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.details()  # type: ignore[attr-defined]
        assert error_info(err).reason == "STREAM_IDLE"
        assert time.monotonic() - started < 15
        # the slot it held is free again
        assert run(alpha, sid, "true").exit_code == 0
        list(_snap(alpha).ExportArchive(snapshot_pb2.ExportArchiveRequest(session_id=sid)))
    finally:
        alpha.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


def test_open_streams_are_capped_per_tenant(alpha: Stubs, beta: Stubs) -> None:
    sid = _session(alpha)
    bystander = _session(beta)
    try:
        stop = threading.Event()
        holder = _snap(alpha).ImportArchive.future(_stalled_upload(sid, stop), timeout=30)
        time.sleep(0.5)  # the first stream is open and counted
        expect_error(
            lambda: list(
                _snap(alpha).ExportArchive(
                    snapshot_pb2.ExportArchiveRequest(session_id=sid), timeout=30
                )
            ),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "TENANT_STREAM_QUOTA",
        )
        # another tenant is not affected by alpha's streams
        assert list(
            _snap(beta).ExportArchive(
                snapshot_pb2.ExportArchiveRequest(session_id=bystander), timeout=30
            )
        )
        # unary calls are not streams: alpha keeps working
        assert run(alpha, sid, "true").exit_code == 0
        stop.set()
        with pytest.raises(grpc.RpcError):
            holder.result(timeout=30)
        assert list(
            _snap(alpha).ExportArchive(
                snapshot_pb2.ExportArchiveRequest(session_id=sid), timeout=30
            )
        )
    finally:
        alpha.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
        beta.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=bystander))


def _export_code(s: Stubs, sid: str) -> grpc.StatusCode:
    """The code of a small export of a missing folder (past the stream cap: NOT_FOUND)."""
    try:
        list(
            _snap(s).ExportArchive(
                snapshot_pb2.ExportArchiveRequest(session_id=sid, path="nothing"), timeout=30
            )
        )
    except grpc.RpcError as err:
        return err.code()  # type: ignore[attr-defined,no-any-return]
    return grpc.StatusCode.OK


def test_export_behind_a_reader_that_stopped_reading_ends(alpha: Stubs, beta: Stubs) -> None:
    sid = _session(alpha)
    bystander = _session(beta)
    try:
        # 64 MiB of incompressible data: far more than gRPC's flow-control windows.
        r = run(alpha, sid, "sh", "-c", "head -c 67108864 /dev/urandom > /workspace/big")
        assert r.exit_code == 0, r.stderr
        replies = _snap(alpha).ExportArchive(
            snapshot_pb2.ExportArchiveRequest(session_id=sid), timeout=120
        )
        next(replies)  # the export started; now this reader stops reading
        # While the stalled stream holds alpha's one slot, alpha cannot open another...
        assert _export_code(alpha, sid) == grpc.StatusCode.RESOURCE_EXHAUSTED
        # ...until the idle timeout ended it and freed its slot.
        started = time.monotonic()
        while (code := _export_code(alpha, sid)) == grpc.StatusCode.RESOURCE_EXHAUSTED:
            assert time.monotonic() - started < 30, "the stalled export still holds its slot"
            time.sleep(0.5)
        assert code == grpc.StatusCode.NOT_FOUND  # past the cap: no such folder (FILE_NOT_FOUND)
        assert run(beta, bystander, "true").exit_code == 0
        replies.cancel()
    finally:
        alpha.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))
        beta.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=bystander))
