"""Shared pieces of the hostile-input suite (tests/integration/test_hostile_*.py); a pytest plugin.

Every hostile case runs beside a *bystander*: a session that the attack does not target. After
each case the `guard` fixture (modules opt in with `pytest.mark.usefixtures("guard")`) checks
that the server still answers health checks as SERVING, that the bystander's file is intact
and that it still runs commands: an attack must fail on its own session and leave the rest of
the server alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc
import pytest
from conftest import ServerProcess, Stubs, run
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sandboxd.v1 import common_pb2, filesystem_pb2, session_pb2

BYSTANDER_FILE = "keep/me.txt"
BYSTANDER_CONTENT = b"untouched by anyone else\n"


@pytest.fixture(scope="module")
def bystander(stubs: Stubs) -> Iterator[str]:
    sid = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            shell=common_pb2.ShellPolicy(allow=["cat", "echo"]),
            workspace=session_pb2.WorkspaceManifest(
                files=[session_pb2.ManifestFile(path=BYSTANDER_FILE, content=BYSTANDER_CONTENT)]
            ),
            labels={"role": "bystander"},
        )
    ).session.session_id
    yield sid
    with contextlib.suppress(grpc.RpcError):
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


@pytest.fixture(scope="module")
def victim(stubs: Stubs) -> Iterator[str]:
    """The session the attacks of a module are aimed at; every command allowed."""
    sid = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
    ).session.session_id
    yield sid
    with contextlib.suppress(grpc.RpcError):
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


def assert_unharmed(server: ServerProcess, stubs: Stubs, bystander: str) -> None:
    assert server.proc.poll() is None, "the server exited:\n" + server.log()
    health = health_pb2_grpc.HealthStub(stubs.channel)
    status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    got = stubs.files.ReadFile(
        filesystem_pb2.ReadFileRequest(session_id=bystander, path=BYSTANDER_FILE), timeout=10
    )
    assert got.content == BYSTANDER_CONTENT
    assert run(stubs, bystander, "cat", BYSTANDER_FILE).stdout == BYSTANDER_CONTENT
    state = stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=bystander))
    assert state.session.state == session_pb2.SESSION_STATE_RUNNING


@pytest.fixture
def guard(server: ServerProcess, stubs: Stubs, bystander: str) -> Iterator[None]:
    yield
    assert_unharmed(server, stubs, bystander)
