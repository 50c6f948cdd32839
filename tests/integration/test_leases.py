"""Leases that say what happens at their end, against a real server: `on_expiry` SUSPEND
(then a resume finds the files), SNAPSHOT_THEN_DELETE, `end_reason` in GetSession, reading
never renews, `renew_on_activity` does."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import grpc
import pytest
from conftest import (
    ServerProcess,
    Stubs,
    error_info,
    make_stubs,
    own_server,
    wait_until,
)
from google.protobuf import duration_pb2
from sandboxd.v1 import (
    audit_pb2,
    audit_pb2_grpc,
    common_pb2,
    filesystem_pb2,
    leases_pb2,
    process_pb2,
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

F, L, P, S = filesystem_pb2, leases_pb2, process_pb2, session_pb2
ALL = common_pb2.ShellPolicy(allow_all=True)


@pytest.fixture(scope="module")
def ls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    owner = "lse" + secrets.token_hex(4)
    with own_server(tmp_path_factory.mktemp("leases") / "data", owner) as srv:
        yield srv


@pytest.fixture(scope="module")
def ls(ls_server: ServerProcess) -> Iterator[Stubs]:
    s = make_stubs(ls_server.address)
    yield s
    s.channel.close()


def _create(s: Stubs, ttl: int, **fields: object) -> session_pb2.Session:
    return s.sessions.CreateSession(
        S.CreateSessionRequest(shell=ALL, lease_ttl=duration_pb2.Duration(seconds=ttl), **fields)  # type: ignore[arg-type]
    ).session


def _get(s: Stubs, sid: str) -> session_pb2.Session:
    return s.sessions.GetSession(S.GetSessionRequest(session_id=sid)).session


def test_on_expiry_suspend_then_resume_finds_the_files(ls: Stubs) -> None:
    made = _create(ls, 3, on_expiry=L.EXPIRY_ACTION_SUSPEND)
    sid = made.session_id
    assert made.on_expiry == L.EXPIRY_ACTION_SUSPEND and made.end_reason == ""
    try:
        ls.files.WriteFile(F.WriteFileRequest(session_id=sid, path="keep.txt", content=b"kept"))
        assert wait_until(lambda: _get(ls, sid).state == S.SESSION_STATE_SUSPENDED, timeout=30), (
            _get(ls, sid)
        )
        suspended = _get(ls, sid)
        assert suspended.end_reason.startswith("lease expired; suspended")
        assert suspended.lease_expires_at.ToDatetime().timestamp() > time.time()
        resumed = ls.sessions.ResumeSession(S.ResumeSessionRequest(session_id=sid)).session
        assert resumed.state == S.SESSION_STATE_RUNNING and resumed.end_reason == ""
        got = ls.files.ReadFile(F.ReadFileRequest(session_id=sid, path="keep.txt"))
        assert got.content == b"kept"
    finally:
        ls.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))


def test_on_expiry_default_deletes_and_says_why(ls: Stubs) -> None:
    sid = _create(ls, 2).session_id
    try:
        assert _get(ls, sid).on_expiry == L.EXPIRY_ACTION_DELETE
        assert wait_until(lambda: _get(ls, sid).state == S.SESSION_STATE_EXPIRED, timeout=30)
        assert _get(ls, sid).end_reason == "lease expired"
        # The reaper's expiry, made outside any call, is in the audit log as the server's own.
        audit = audit_pb2_grpc.AuditServiceStub(ls.channel)
        events = audit.ListAuditEvents(
            audit_pb2.ListAuditEventsRequest(session_id=sid, kinds=["lifecycle"])
        ).events
        server_made = [e.attributes for e in events if e.attributes.get("action") == "server"]
        assert server_made == [{"action": "server", "state": "EXPIRED"}]
    finally:
        ls.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))


def test_on_expiry_snapshot_then_delete_keeps_a_snapshot(ls: Stubs) -> None:
    sid = _create(ls, 2, on_expiry=L.EXPIRY_ACTION_SNAPSHOT_THEN_DELETE).session_id
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(ls.channel)
    try:
        ls.files.WriteFile(F.WriteFileRequest(session_id=sid, path="a.txt", content=b"a"))
        assert wait_until(lambda: _get(ls, sid).state == S.SESSION_STATE_EXPIRED, timeout=30)
        reason = _get(ls, sid).end_reason
        assert reason.startswith("lease expired; snapshot snap-"), reason
        listed = snaps.ListSnapshots(snapshot_pb2.ListSnapshotsRequest(session_id=sid)).snapshots
        assert reason.split()[3] in {s.snapshot_id for s in listed}
    finally:
        ls.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))


def test_reading_never_renews_and_activity_renews_only_when_asked(ls: Stubs) -> None:
    plain = _create(ls, 600)
    eager = _create(ls, 600, renew_on_activity=True)
    try:
        assert eager.renew_on_activity and not plain.renew_on_activity
        for _ in range(3):
            for s in (plain, eager):
                _get(ls, s.session_id)
                ls.sessions.ListSessions(S.ListSessionsRequest())
        assert _get(ls, plain.session_id).lease_expires_at == plain.lease_expires_at
        assert _get(ls, eager.session_id).lease_expires_at == eager.lease_expires_at
        time.sleep(1.1)
        for s in (plain, eager):
            ls.processes.Run(P.RunRequest(session_id=s.session_id, argv=["true"]))
        assert _get(ls, plain.session_id).lease_expires_at == plain.lease_expires_at
        assert (
            _get(ls, eager.session_id).lease_expires_at.ToDatetime()
            > eager.lease_expires_at.ToDatetime()
        )
    finally:
        for s in (plain, eager):
            ls.sessions.DeleteSession(S.DeleteSessionRequest(session_id=s.session_id))


def test_an_unknown_expiry_action_is_refused(ls: Stubs) -> None:
    with pytest.raises(grpc.RpcError) as bad:
        ls.sessions.CreateSession(S.CreateSessionRequest(on_expiry=99))  # type: ignore[arg-type]
    assert error_info(bad.value).reason == "INVALID_EXPIRY_ACTION"


def test_every_session_answer_carries_its_lease_terms(ls: Stubs) -> None:
    """UpdateNetworkPolicy answers with the Session too: its terms, not an unset field's
    defaults (they were missing there once, while Get/List/Renew had them)."""
    sid = _create(ls, 600, on_expiry=L.EXPIRY_ACTION_SUSPEND, renew_on_activity=True).session_id
    try:
        updated = ls.sessions.UpdateNetworkPolicy(
            S.UpdateNetworkPolicyRequest(session_id=sid, network=common_pb2.NetworkPolicy())
        ).session
        assert updated.on_expiry == L.EXPIRY_ACTION_SUSPEND and updated.renew_on_activity
    finally:
        ls.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid))
