"""Paging on ListProcesses and ListDir against the real engine: pages walk
the whole list once, tokens are bound to the list and filter that made them, and a request
without page_size answers in one reply as before paging."""

from __future__ import annotations

import secrets

import grpc
from conftest import SessionFactory, Stubs, expect_error, run
from google.protobuf import duration_pb2
from sandboxd.v1 import filesystem_pb2, process_pb2, session_pb2, snapshot_pb2, snapshot_pb2_grpc

F = filesystem_pb2
P = process_pb2


def test_list_dir_pages_in_path_order(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    run(stubs, sid, "sh", "-c", "mkdir -p d/sub && for i in $(seq 1 23); do touch d/f$i; done")
    run(stubs, sid, "touch", "d/sub/x")
    whole = stubs.files.ListDir(F.ListDirRequest(session_id=sid, path="d", depth=2))
    assert whole.next_page_token == "" and len(whole.entries) == 25  # as before paging
    paths: list[str] = []
    token, pages = "", 0
    while True:
        resp = stubs.files.ListDir(
            F.ListDirRequest(session_id=sid, path="d", depth=2, page_size=10, page_token=token)
        )
        paths += [e.path for e in resp.entries]
        pages += 1
        token = resp.next_page_token
        if not token:
            break
    assert pages == 3 and paths == sorted(e.path for e in whole.entries)
    first = stubs.files.ListDir(F.ListDirRequest(session_id=sid, path="d", page_size=5))
    for other in (
        F.ListDirRequest(session_id=sid, path="d/sub", page_token=first.next_page_token),
        F.ListDirRequest(session_id=sid, path="d", depth=2, page_token=first.next_page_token),
        F.ListDirRequest(session_id=sid, path="d", page_token="forged"),
    ):
        expect_error(
            lambda other=other: stubs.files.ListDir(other),  # type: ignore[misc]
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_PAGE_TOKEN",
        )
    expect_error(
        lambda: stubs.files.ListDir(F.ListDirRequest(session_id=sid, path="d", page_size=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_SIZE",
    )


def test_list_processes_pages_and_binds_tokens_to_the_session(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session().session_id
    other = new_session().session_id
    for i in range(5):
        stubs.processes.StartProcess(
            P.StartProcessRequest(
                session_id=sid,
                argv=["true"],
                process_id=f"job-{i}",
                timeout=duration_pb2.Duration(seconds=30),
            )
        )
    whole = stubs.processes.ListProcesses(P.ListProcessesRequest(session_id=sid))
    assert [p.process_id for p in whole.processes] == [f"job-{i}" for i in range(5)]
    assert whole.next_page_token == ""
    first = stubs.processes.ListProcesses(P.ListProcessesRequest(session_id=sid, page_size=2))
    second = stubs.processes.ListProcesses(
        P.ListProcessesRequest(session_id=sid, page_size=2, page_token=first.next_page_token)
    )
    third = stubs.processes.ListProcesses(
        P.ListProcessesRequest(session_id=sid, page_size=2, page_token=second.next_page_token)
    )
    got = [p.process_id for r in (first, second, third) for p in r.processes]
    assert got == [f"job-{i}" for i in range(5)] and third.next_page_token == ""
    expect_error(
        lambda: stubs.processes.ListProcesses(
            P.ListProcessesRequest(session_id=other, page_token=first.next_page_token)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )


def test_a_token_of_one_list_is_refused_by_another(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session(labels={"paging": "yes"}).session_id
    new_session(labels={"paging": "yes"})
    resp = stubs.sessions.ListSessions(
        session_pb2.ListSessionsRequest(label_selector={"paging": "yes"}, page_size=1)
    )
    assert resp.next_page_token
    expect_error(
        lambda: stubs.sessions.ListSessions(
            session_pb2.ListSessionsRequest(
                label_selector={"paging": "no"}, page_token=resp.next_page_token
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )
    expect_error(
        lambda: stubs.processes.ListProcesses(
            P.ListProcessesRequest(session_id=sid, page_token=resp.next_page_token)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )


def test_list_sessions_state_filter(stubs: Stubs, new_session: SessionFactory) -> None:
    label = {"state-filter": secrets.token_hex(4)}
    running = new_session(labels=label).session_id
    suspended = new_session(labels=label).session_id
    stubs.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=suspended))

    def listed(state: int) -> list[str]:
        req = session_pb2.ListSessionsRequest(label_selector=label, state=state)  # type: ignore[arg-type]
        return [s.session_id for s in stubs.sessions.ListSessions(req).sessions]

    assert sorted(listed(session_pb2.SESSION_STATE_UNSPECIFIED)) == sorted([running, suspended])
    assert listed(session_pb2.SESSION_STATE_RUNNING) == [running]
    assert listed(session_pb2.SESSION_STATE_SUSPENDED) == [suspended]
    assert listed(session_pb2.SESSION_STATE_FAILED) == []
    expect_error(lambda: listed(99), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")


def test_list_snapshots_label_selector(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(stubs.channel)
    tagged = snaps.CreateSnapshot(
        snapshot_pb2.CreateSnapshotRequest(session_id=sid, labels={"keep": "yes"})
    ).snapshot
    snaps.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(session_id=sid, labels={"keep": "no"}))

    def listed(selector: dict[str, str]) -> list[str]:
        req = snapshot_pb2.ListSnapshotsRequest(session_id=sid, label_selector=selector)
        return [s.snapshot_id for s in snaps.ListSnapshots(req).snapshots]

    assert listed({"keep": "yes"}) == [tagged.snapshot_id]
    assert len(listed({})) == 2
    assert listed({"keep": "maybe"}) == []
    expect_error(
        lambda: listed({"bad key!": "x"}), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_LABELS"
    )
