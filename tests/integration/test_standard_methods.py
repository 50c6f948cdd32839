"""Standard-method semantics against the real engine: DeleteSession is idempotent
and says whether it removed anything; request_id makes StartProcess and CreateSnapshot safe
to retry (AIP-155)."""

from __future__ import annotations

import time

import grpc
from conftest import ServerProcess, SessionFactory, Stubs, expect_error
from google.protobuf import duration_pb2
from sandboxd.v1 import process_pb2, session_pb2, snapshot_pb2, snapshot_pb2_grpc
from sandboxd_client import SandboxClient

P = process_pb2


def test_delete_session_says_whether_it_existed(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    req = session_pb2.DeleteSessionRequest(session_id=sid)
    assert stubs.sessions.DeleteSession(req).existed is True
    assert stubs.sessions.DeleteSession(req).existed is False  # idempotent: no error
    never = session_pb2.DeleteSessionRequest(session_id="never-made-" + sid[:8])
    assert stubs.sessions.DeleteSession(never).existed is False


def test_start_process_request_id_makes_a_retry_return_the_first_process(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id

    def start(argv: list[str], request_id: str) -> P.Process:
        return stubs.processes.StartProcess(  # type: ignore[no-any-return]
            P.StartProcessRequest(
                session_id=sid,
                argv=argv,
                request_id=request_id,
                timeout=duration_pb2.Duration(seconds=30),
            )
        ).process

    first = start(["sleep", "20"], "req-1")
    again = start(["sleep", "20"], "req-1")
    assert first.process_id == again.process_id
    other = start(["sleep", "20"], "req-2")
    assert other.process_id != first.process_id
    listed = stubs.processes.ListProcesses(P.ListProcessesRequest(session_id=sid)).processes
    assert len(listed) == 2
    expect_error(
        lambda: start(["sleep", "21"], "req-1"),
        grpc.StatusCode.ALREADY_EXISTS,
        "PROCESS_ALREADY_EXISTS",
    )
    expect_error(lambda: start(["sleep", "1"], "bad\nid"), grpc.StatusCode.INVALID_ARGUMENT)
    for p in (first, other):
        stubs.processes.SignalProcess(
            P.SignalProcessRequest(session_id=sid, process_id=p.process_id, signal="SIGKILL")
        )


def test_create_snapshot_request_id_makes_a_retry_return_the_first_snapshot(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)

    def create(request_id: str) -> snapshot_pb2.Snapshot:
        req = snapshot_pb2.CreateSnapshotRequest(session_id=sid, request_id=request_id)
        return snaps.CreateSnapshot(req, timeout=120).snapshot  # type: ignore[no-any-return]

    first = create("snap-1")
    assert create("snap-1").snapshot_id == first.snapshot_id
    assert create("snap-2").snapshot_id != first.snapshot_id
    assert create("").snapshot_id != create("").snapshot_id  # no request_id: no memory
    snaps.DeleteSnapshot(snapshot_pb2.DeleteSnapshotRequest(snapshot_id=first.snapshot_id))
    assert create("snap-1").snapshot_id != first.snapshot_id  # deleted: made again
    expect_error(lambda: create("x" * 200), grpc.StatusCode.INVALID_ARGUMENT)


def test_session_state_reason(stubs: Stubs, new_session: SessionFactory) -> None:
    s = new_session()
    assert not s.HasField("state_reason")
    stubs.sessions.RenewLease(
        session_pb2.RenewLeaseRequest(session_id=s.session_id, ttl=duration_pb2.Duration(seconds=1))
    )
    time.sleep(1.5)
    got = stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=s.session_id))
    why = got.session.state_reason
    assert why.reason == "LEASE_EXPIRED" and not why.recoverable and why.message


async def test_the_python_client_shows_the_state_reason(
    server: ServerProcess, stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    stubs.sessions.RenewLease(
        session_pb2.RenewLeaseRequest(session_id=sid, ttl=duration_pb2.Duration(seconds=1))
    )
    time.sleep(1.5)
    async with SandboxClient(server.address) as client:
        info = (await client.get_session(sid)).info
    assert info.state_reason is not None
    assert info.state_reason.reason == "LEASE_EXPIRED" and not info.state_reason.recoverable
