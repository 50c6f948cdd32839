"""More live sessions than the engine's connection pool: every live sandbox holds its agent
channel's connection for as long as it lives, so those connections must not come out of the
pool that every engine call (create, inspect, delete) needs. With them in it, a server with
`docker_pool_size` live sessions could neither create another nor delete one: every engine call
waited forever (here: the creates past the pool's size ran into their deadline)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import grpc
import pytest
from conftest import ServerProcess, own_server
from containers import owned_containers
from sandboxd.v1 import (
    common_pb2,
    process_pb2,
    process_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)

POOL = 10  # the smallest docker_pool_size the server takes
SESSIONS = POOL + 4
DEADLINE_S = 120  # a create or delete that waits for a pooled connection fails here


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    owner = "many" + secrets.token_hex(4)
    with own_server(
        tmp_path_factory.mktemp("many") / "data", owner, "--docker-pool-size", str(POOL)
    ) as srv:
        yield srv


def test_more_live_sessions_than_engine_connections_are_created_used_and_deleted(
    server: ServerProcess,
) -> None:
    with grpc.insecure_channel(server.address) as channel:
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        processes = process_pb2_grpc.ProcessServiceStub(channel)
        sids = []
        try:
            for _ in range(SESSIONS):
                created = sessions.CreateSession(
                    session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True)),
                    timeout=DEADLINE_S,
                )
                sids.append(created.session.session_id)
            for sid in sids:
                run = processes.Run(
                    process_pb2.RunRequest(session_id=sid, argv=["echo", sid]),
                    timeout=DEADLINE_S,
                )
                assert run.exit_code == 0 and run.stdout == f"{sid}\n".encode()
        finally:
            for sid in sids:
                sessions.DeleteSession(
                    session_pb2.DeleteSessionRequest(session_id=sid), timeout=DEADLINE_S
                )
    assert len(sids) == SESSIONS
    assert owned_containers(server.owner_id) == []
