"""Tenant scoping (another tenant's session is NOT_FOUND, like a missing one) and quotas."""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from authutil import authed_stubs, write_tokens
from conftest import (
    ServerProcess,
    Stubs,
    error_info,
    expect_error,
    remove_owned_containers,
    run,
    start_server,
)
from sandboxd.models import SessionState
from sandboxd.store import SessionStore
from sandboxd.v1 import (
    common_pb2,
    filesystem_pb2,
    process_pb2,
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

S, F, P, N = session_pb2, filesystem_pb2, process_pb2, snapshot_pb2
TOKENS = {"a-" + secrets.token_urlsafe(16): "alpha", "b-" + secrets.token_urlsafe(16): "beta"}
TOKEN_OF = {tenant: token for token, tenant in TOKENS.items()}
ALL = common_pb2.ShellPolicy(allow_all=True)
MiB = 1024 * 1024


def _server(tmp: Path, *flags: str) -> ServerProcess:
    tokens = write_tokens(tmp / "tokens", TOKENS)
    owner = "ten" + secrets.token_hex(4)
    return start_server(tmp / "data", owner, "--tokens-file", str(tokens), *flags)


@pytest.fixture(scope="module")
def tenant_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = _server(tmp_path_factory.mktemp("tenants"))
    yield srv
    srv.stop()
    remove_owned_containers(srv.owner_id)


@pytest.fixture(scope="module")
def alpha(tenant_server: ServerProcess) -> Iterator[Stubs]:
    s = authed_stubs(tenant_server.address, TOKEN_OF["alpha"])
    yield s
    s.channel.close()


@pytest.fixture(scope="module")
def beta(tenant_server: ServerProcess) -> Iterator[Stubs]:
    s = authed_stubs(tenant_server.address, TOKEN_OF["beta"])
    yield s
    s.channel.close()


@pytest.fixture(scope="module")
def alpha_session(alpha: Stubs) -> Iterator[str]:
    sid = "alpha.owned"
    alpha.sessions.CreateSession(
        S.CreateSessionRequest(
            session_id=sid,
            shell=ALL,
            labels={"team": "shared-label"},
            workspace=S.WorkspaceManifest(
                files=[S.ManifestFile(path="secret.txt", content=b"alpha secret")]
            ),
        )
    )
    alpha.processes.StartProcess(
        P.StartProcessRequest(session_id=sid, process_id="bg", argv=["sleep", "600"])
    )
    yield sid
    alpha.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))


def _session_calls(s: Stubs, sid: str) -> dict[str, Callable[[], object]]:
    return {
        "GetSession": lambda: s.sessions.GetSession(S.GetSessionRequest(session_id=sid)),
        "RenewLease": lambda: s.sessions.RenewLease(S.RenewLeaseRequest(session_id=sid)),
        "Run": lambda: s.processes.Run(P.RunRequest(session_id=sid, argv=["cat", "secret.txt"])),
        "Exec": lambda: s.processes.Exec(P.ExecRequest(session_id=sid, argv=["true"])),
        "ReadFile": lambda: s.files.ReadFile(F.ReadFileRequest(session_id=sid, path="secret.txt")),
        "WriteFile": lambda: s.files.WriteFile(
            F.WriteFileRequest(session_id=sid, path="secret.txt", content=b"overwritten")
        ),
        "ListDir": lambda: s.files.ListDir(F.ListDirRequest(session_id=sid)),
        "Stat": lambda: s.files.Stat(F.StatRequest(session_id=sid, path="secret.txt")),
        "Remove": lambda: s.files.Remove(F.RemoveRequest(session_id=sid, path="secret.txt")),
        "MakeDir": lambda: s.files.MakeDir(F.MakeDirRequest(session_id=sid, path="d")),
        "SuspendSession": lambda: s.sessions.SuspendSession(
            S.SuspendSessionRequest(session_id=sid)
        ),
        "ResumeSession": lambda: s.sessions.ResumeSession(S.ResumeSessionRequest(session_id=sid)),
        "UpdateNetworkPolicy": lambda: s.sessions.UpdateNetworkPolicy(
            S.UpdateNetworkPolicyRequest(session_id=sid)
        ),
        "ListEgressEvents": lambda: s.sessions.ListEgressEvents(
            S.ListEgressEventsRequest(session_id=sid)
        ),
        "StartProcess": lambda: s.processes.StartProcess(
            P.StartProcessRequest(session_id=sid, argv=["sleep", "1"])
        ),
        "ListProcesses": lambda: s.processes.ListProcesses(P.ListProcessesRequest(session_id=sid)),
        "AttachProcess": lambda: s.processes.AttachProcess(
            P.AttachProcessRequest(session_id=sid, process_id="bg")
        ),
        "SignalProcess": lambda: s.processes.SignalProcess(
            P.SignalProcessRequest(session_id=sid, process_id="bg", signal="SIGKILL")
        ),
        "Interact": lambda: s.processes.Interact(
            iter(
                [
                    P.InteractRequest(
                        start=P.InteractStart(request=P.ExecRequest(session_id=sid, argv=["true"]))
                    )
                ]
            )
        ),
        "CreateSnapshot": lambda: _snap(s).CreateSnapshot(N.CreateSnapshotRequest(session_id=sid)),
        "ListSnapshots": lambda: _snap(s).ListSnapshots(N.ListSnapshotsRequest(session_id=sid)),
        "ExportArchive": lambda: _snap(s).ExportArchive(N.ExportArchiveRequest(session_id=sid)),
        "ImportArchive": lambda: _snap(s).ImportArchive(
            iter([N.ImportArchiveRequest(header=N.ImportArchiveHeader(session_id=sid))])
        ),
    }


def _snap(s: Stubs) -> snapshot_pb2_grpc.SnapshotServiceStub:
    return snapshot_pb2_grpc.SnapshotServiceStub(s.channel)


def test_other_tenants_session_is_not_found_like_a_missing_one(
    alpha: Stubs, beta: Stubs, alpha_session: str
) -> None:
    missing = "alpha.never-created"
    for name, call in _session_calls(beta, alpha_session).items():
        theirs = expect_error(call, grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")
        absent = expect_error(
            _session_calls(beta, missing)[name], grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND"
        )
        # the same answer, word for word, with only the id that was asked about changed
        assert theirs.details().replace(alpha_session, missing) == absent.details(), name  # type: ignore[attr-defined]
        for err, sid in ((theirs, alpha_session), (absent, missing)):  # old key and its twin
            assert dict(error_info(err).metadata) == {"sessionId": sid}
    # and nothing happened to alpha's session or its background process
    assert run(alpha, alpha_session, "cat", "secret.txt").stdout == b"alpha secret"
    assert run(alpha, alpha_session, "ls").stdout == b"secret.txt\n"
    got = alpha.sessions.GetSession(S.GetSessionRequest(session_id=alpha_session)).session
    assert got.state == S.SESSION_STATE_RUNNING
    procs = alpha.processes.ListProcesses(P.ListProcessesRequest(session_id=alpha_session))
    assert [p.process_id for p in procs.processes] == ["bg"]


def test_other_tenants_snapshot_is_not_found_like_a_missing_one(
    alpha: Stubs, beta: Stubs, alpha_session: str
) -> None:
    snap = _snap(alpha).CreateSnapshot(N.CreateSnapshotRequest(session_id=alpha_session)).snapshot
    missing = "snap-0000000000000000"
    calls: dict[str, Callable[[str], object]] = {
        "GetSnapshot": lambda i: _snap(beta).GetSnapshot(N.GetSnapshotRequest(snapshot_id=i)),
        "DownloadSnapshot": lambda i: _snap(beta).DownloadSnapshot(
            N.DownloadSnapshotRequest(snapshot_id=i)
        ),
        "Fork": lambda i: beta.sessions.CreateSession(S.CreateSessionRequest(from_snapshot_id=i)),
    }
    try:
        for name, call in calls.items():
            theirs = expect_error(lambda c=call: c(snap.snapshot_id), grpc.StatusCode.NOT_FOUND)
            absent = expect_error(lambda c=call: c(missing), grpc.StatusCode.NOT_FOUND)
            assert error_info(theirs).reason == error_info(absent).reason, name
            assert theirs.details().replace(snap.snapshot_id, missing) == absent.details(), name  # type: ignore[attr-defined]
        _snap(beta).DeleteSnapshot(N.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id))
        assert list(_snap(beta).ListSnapshots(N.ListSnapshotsRequest()).snapshots) == []
        # alpha still has it
        got = _snap(alpha).GetSnapshot(N.GetSnapshotRequest(snapshot_id=snap.snapshot_id))
        assert got.snapshot.sha256 == snap.sha256
    finally:
        _snap(alpha).DeleteSnapshot(N.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id))


def test_delete_of_other_tenants_session_is_a_no_op(
    alpha: Stubs, beta: Stubs, alpha_session: str
) -> None:
    beta.sessions.DeleteSession(S.DeleteSessionRequest(session_id=alpha_session))
    got = alpha.sessions.GetSession(S.GetSessionRequest(session_id=alpha_session)).session
    assert got.state == S.SESSION_STATE_RUNNING
    assert run(alpha, alpha_session, "cat", "secret.txt").stdout == b"alpha secret"


def test_list_shows_only_own_sessions(alpha: Stubs, beta: Stubs, alpha_session: str) -> None:
    mine = beta.sessions.CreateSession(S.CreateSessionRequest(shell=ALL)).session.session_id
    try:
        beta_ids = {
            s.session_id for s in beta.sessions.ListSessions(S.ListSessionsRequest()).sessions
        }
        assert beta_ids == {mine}
        selected = beta.sessions.ListSessions(
            S.ListSessionsRequest(label_selector={"team": "shared-label"})
        ).sessions
        assert list(selected) == []
        alpha_ids = {
            s.session_id for s in alpha.sessions.ListSessions(S.ListSessionsRequest()).sessions
        }
        assert alpha_session in alpha_ids and mine not in alpha_ids
        # a page token naming an id before alpha's does not reveal alpha's either
        page = beta.sessions.ListSessions(S.ListSessionsRequest(page_size=1)).sessions
        assert [s.session_id for s in page] == [mine]
    finally:
        beta.sessions.DeleteSession(S.DeleteSessionRequest(session_id=mine))


def test_ids_are_partitioned_by_tenant(alpha: Stubs, beta: Stubs, alpha_session: str) -> None:
    # beta cannot choose an id outside "beta.", and the answer does not depend on whether
    # the id exists (alpha.owned does, alpha.free does not)
    answers = []
    for sid in (alpha_session, "alpha.free", "owned", "betaowned", "alpha.beta.x"):
        err = expect_error(
            lambda sid=sid: beta.sessions.CreateSession(S.CreateSessionRequest(session_id=sid)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_SESSION_ID",
        )
        answers.append(err.details().replace(sid, "<id>"))  # type: ignore[attr-defined]
    assert len(set(answers)) == 1
    expect_error(
        lambda: beta.sessions.CreateSession(S.CreateSessionRequest(session_id="beta.")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_SESSION_ID",
    )
    # beta's own id with the same suffix is a different session
    theirs = beta.sessions.CreateSession(
        S.CreateSessionRequest(session_id="beta.owned", shell=ALL)
    ).session
    try:
        assert run(beta, theirs.session_id, "ls").stdout == b""
        assert run(alpha, alpha_session, "cat", "secret.txt").stdout == b"alpha secret"
    finally:
        beta.sessions.DeleteSession(S.DeleteSessionRequest(session_id=theirs.session_id))


def test_server_chosen_ids_carry_the_tenant(beta: Stubs) -> None:
    sid = beta.sessions.CreateSession(S.CreateSessionRequest()).session.session_id
    beta.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))
    assert sid.startswith("beta.s-")


def test_without_tokens_ids_are_not_partitioned(stubs: Stubs) -> None:
    sid = stubs.sessions.CreateSession(S.CreateSessionRequest(session_id="plain-id")).session
    stubs.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid.session_id))
    assert sid.session_id == "plain-id"


# --------------------------------------------------------------------------------------------
# Quotas
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quota_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = _server(
        tmp_path_factory.mktemp("quota"),
        "--tenant-max-sessions",
        "3",
        "--tenant-max-memory-bytes",
        "160Mi",
        "--tenant-max-concurrent-execs",
        "1",
    )
    yield srv
    srv.stop()
    remove_owned_containers(srv.owner_id)


def _create(s: Stubs, sid: str, memory: int) -> object:
    return s.sessions.CreateSession(
        S.CreateSessionRequest(
            session_id=sid, shell=ALL, limits=common_pb2.ResourceLimits(memory_bytes=memory)
        )
    )


def test_session_and_memory_quotas(quota_server: ServerProcess) -> None:
    a = authed_stubs(quota_server.address, TOKEN_OF["alpha"])
    b = authed_stubs(quota_server.address, TOKEN_OF["beta"])
    try:
        _create(a, "alpha.q1", 64 * MiB)
        _create(a, "alpha.q2", 64 * MiB)
        err = expect_error(
            lambda: _create(a, "alpha.q3", 64 * MiB),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "TENANT_MEMORY_QUOTA",
        )
        assert "quota of 167772160" in err.details()  # type: ignore[attr-defined]
        _create(a, "alpha.q3", 16 * MiB)  # fits in what is left
        expect_error(
            lambda: _create(a, "alpha.q4", 8 * MiB),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "TENANT_SESSION_QUOTA",
        )
        # quotas are per tenant: beta is not affected by alpha's usage
        _create(b, "beta.q1", 64 * MiB)
        # the idempotent re-create of an existing session is not a new session
        _create(a, "alpha.q3", 16 * MiB)
        # deleting frees the quota
        a.sessions.DeleteSession(S.DeleteSessionRequest(session_id="alpha.q1"))
        _create(a, "alpha.q4", 64 * MiB)
        assert quota_server.proc.poll() is None
    finally:
        for sid in ("alpha.q1", "alpha.q2", "alpha.q3", "alpha.q4"):
            a.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))
        b.sessions.DeleteSession(S.DeleteSessionRequest(session_id="beta.q1"))
        a.channel.close()
        b.channel.close()


def _wait_for_slot(s: Stubs, sid: str) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            run(s, sid, "true")
            return
        except grpc.RpcError as err:
            assert error_info(err).reason == "TENANT_EXEC_QUOTA"
            assert time.monotonic() < deadline, "exec slot not released"
            time.sleep(0.2)


def test_concurrent_exec_quota(quota_server: ServerProcess) -> None:
    a = authed_stubs(quota_server.address, TOKEN_OF["alpha"])
    b = authed_stubs(quota_server.address, TOKEN_OF["beta"])
    try:
        _create(a, "alpha.x", 64 * MiB)
        _create(b, "beta.x", 64 * MiB)
        stream = a.processes.Exec(P.ExecRequest(session_id="alpha.x", argv=["sleep", "3"]))
        first = next(iter(stream))
        assert first.WhichOneof("event") == "started"
        expect_error(
            lambda: run(a, "alpha.x", "true"),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "TENANT_EXEC_QUOTA",
        )
        assert run(b, "beta.x", "echo", "b").stdout == b"b\n"  # other tenants keep running
        events = list(stream)
        assert events[-1].exited.exit_code == 0
        assert run(a, "alpha.x", "echo", "again").stdout == b"again\n"  # the slot came back
        # a background process holds a slot until it ends
        a.processes.StartProcess(
            P.StartProcessRequest(session_id="alpha.x", process_id="bg1", argv=["sleep", "2"])
        )
        expect_error(
            lambda: run(a, "alpha.x", "true"),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "TENANT_EXEC_QUOTA",
        )
        expect_error(
            lambda: a.processes.StartProcess(
                P.StartProcessRequest(session_id="alpha.x", process_id="bg2", argv=["true"])
            ),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "TENANT_EXEC_QUOTA",
        )
        _wait_for_slot(a, "alpha.x")
        # a cancelled stream gives its slot back too
        stream = a.processes.Exec(P.ExecRequest(session_id="alpha.x", argv=["sleep", "30"]))
        next(iter(stream))
        stream.cancel()
        _wait_for_slot(a, "alpha.x")
    finally:
        a.sessions.DeleteSession(S.DeleteSessionRequest(session_id="alpha.x"))
        b.sessions.DeleteSession(S.DeleteSessionRequest(session_id="beta.x"))
        a.channel.close()
        b.channel.close()


def test_parallel_creates_cannot_overshoot_the_session_quota(quota_server: ServerProcess) -> None:
    a = authed_stubs(quota_server.address, TOKEN_OF["alpha"])
    results: list[str] = []

    def create(i: int) -> None:
        try:
            _create(a, f"alpha.p{i}", 8 * MiB)
            results.append("ok")
        except grpc.RpcError as err:
            results.append(error_info(err).reason)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert results.count("ok") == 3, results
        assert results.count("TENANT_SESSION_QUOTA") == 3, results
    finally:
        for i in range(6):
            a.sessions.DeleteSession(S.DeleteSessionRequest(session_id=f"alpha.p{i}"))
        a.channel.close()


# --------------------------------------------------------------------------------------------
# Store migration
# --------------------------------------------------------------------------------------------

_OLD_SCHEMA = """
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    lease_expires_at REAL NOT NULL,
    container_id TEXT NOT NULL DEFAULT '',
    labels TEXT NOT NULL,
    spec TEXT NOT NULL
);
"""


async def test_database_from_before_tenants_is_migrated(tmp_path: Path) -> None:
    spec = {
        "image": "img",
        "limits": {
            "memory_bytes": 64 * MiB,
            "cpu_millis": 500,
            "pids": 64,
            "workspace_bytes": MiB,
            "file_bytes": MiB,
            "output_bytes": MiB,
            "command_timeout_s": 10.0,
        },
        "shell": {"allow": [], "allow_all": False},
        "network": {
            "mode": "DENY",
            "allowed_domains": [],
            "allowed_ports": [],
            "allow_private_networks": False,
        },
        "env": {},
        "uid": 65534,
        "gid": 65534,
        "manifest": {"id": "", "files": [], "directories": []},
    }
    path = tmp_path / "sessions.db"
    db = sqlite3.connect(path)
    db.executescript(_OLD_SCHEMA)
    db.execute(
        "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        ("old", "fp", "RUNNING", time.time(), time.time() + 60, "", "{}", json.dumps(spec)),
    )
    db.commit()
    db.close()
    async with SessionStore(path) as store:
        got = await store.get("old")
        assert got is not None and got.tenant == "default"
        live = (SessionState.RUNNING.value,)
        assert await store.tenant_usage("default", live) == (1, 64 * MiB)
        assert await store.tenant_usage("alpha", live) == (0, 0)
        assert [s.session_id for s in await store.page(after="", limit=5, tenant="alpha")] == []
    async with SessionStore(path) as store:  # a second open finds the column in place
        assert (await store.get("old")) is not None
