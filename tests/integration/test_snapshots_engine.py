"""The engine stops and starts again (a private dockerd, never the shared one): sessions with a
snapshot come back from it on resume, a session without one says CONTAINER_LOST."""

from __future__ import annotations

import secrets
import signal
from pathlib import Path

import grpc
from conftest import expect_error, make_stubs, run, start_server, wait_until
from sandboxd.v1 import admin_pb2, common_pb2, session_pb2, snapshot_pb2, snapshot_pb2_grpc
from test_engine_outage import PrivateEngine, engine, pytestmark  # noqa: F401  (fixture, skip)


def test_sessions_come_back_from_their_last_snapshot(engine: PrivateEngine, tmp_path: Path) -> None:  # noqa: F811
    owner = "snapeng" + secrets.token_hex(3)
    server = start_server(tmp_path, owner, "--docker-host", engine.host)
    stubs = make_stubs(server.address)
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)
    shell = common_pb2.ShellPolicy(allow_all=True)
    try:
        kept = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(session_id="kept", shell=shell)
        ).session.session_id
        bare = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(session_id="bare", shell=shell)
        ).session.session_id
        assert run(stubs, kept, "sh", "-c", "echo saved > s").exit_code == 0
        snaps.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(session_id=kept))
        assert run(stubs, kept, "sh", "-c", "echo later > u").exit_code == 0

        engine.stop()
        engine.start()

        def state(sid: str) -> int:
            req = session_pb2.GetSessionRequest(session_id=sid)
            return stubs.sessions.GetSession(req).session.state  # type: ignore[no-any-return]

        # Reconcile runs when the engine answers again and finds both containers stopped.
        assert wait_until(lambda: state(kept) == session_pb2.SESSION_STATE_SUSPENDED, 60)
        assert state(bare) == session_pb2.SESSION_STATE_FAILED
        resumed = stubs.sessions.ResumeSession(session_pb2.ResumeSessionRequest(session_id=kept))
        assert resumed.session.state == session_pb2.SESSION_STATE_RUNNING
        assert run(stubs, kept, "cat", "s").stdout == b"saved\n"
        assert run(stubs, kept, "cat", "u").exit_code != 0  # after the snapshot: lost, said so
        expect_error(
            lambda: stubs.sessions.ResumeSession(session_pb2.ResumeSessionRequest(session_id=bare)),
            grpc.StatusCode.FAILED_PRECONDITION,
            "CONTAINER_LOST",
        )
        # The stopped containers were not reused; a sweep removes the failed session's one.
        stubs.admin.Sweep(admin_pb2.SweepRequest())
        states = engine.docker("ps", "-a", "--format", "{{.State}}").stdout.decode().split()
        assert states == ["running"]
    finally:
        stubs.channel.close()
        server.stop(signal.SIGTERM)
