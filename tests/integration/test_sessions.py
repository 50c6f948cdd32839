"""SessionService against the real engine: lifecycle, idempotency, leases, bad input."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import grpc
import pytest
from conftest import (
    ServerProcess,
    SessionFactory,
    Stubs,
    expect_error,
    make_stubs,
    remove_owned_containers,
    run,
    start_server,
    wait_until,
)
from containers import inspect_container, session_containers
from google.protobuf import duration_pb2
from sandboxd.v1 import common_pb2, images_pb2, session_pb2

S = session_pb2


def _container_state(session_id: str, owner: str) -> str:
    ids = session_containers(session_id, owner)
    return "\n".join(inspect_container(i)["State"]["Status"] for i in ids)


def test_create_get_delete(
    stubs: Stubs, server: ServerProcess, new_session: SessionFactory
) -> None:
    s = new_session(labels={"team": "a"})
    assert s.state == S.SESSION_STATE_RUNNING
    assert s.session_id.startswith("s-")
    assert len(s.fingerprint) == 64
    assert s.assurance == common_pb2.ASSURANCE_ENFORCED
    uid = int(s.user.partition(":")[0])  # the session's own host identity (uid = gid)
    assert s.user == f"{uid}:{uid}" and 1_900_000_000 <= uid < 1_900_065_536
    assert s.limits.memory_bytes == 256 * 1024 * 1024
    assert s.limits.pids == 64
    assert s.limits.command_timeout.seconds == 10
    assert s.network.mode == common_pb2.NETWORK_MODE_DENY
    assert s.lease_expires_at.seconds - s.created_at.seconds == pytest.approx(900, abs=2)
    assert _container_state(s.session_id, server.owner_id) == "running"

    got = stubs.sessions.GetSession(S.GetSessionRequest(session_id=s.session_id)).session
    assert got == s

    stubs.sessions.DeleteSession(S.DeleteSessionRequest(session_id=s.session_id))
    assert _container_state(s.session_id, server.owner_id) == ""
    expect_error(
        lambda: stubs.sessions.GetSession(S.GetSessionRequest(session_id=s.session_id)),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    )
    # idempotent
    stubs.sessions.DeleteSession(S.DeleteSessionRequest(session_id=s.session_id))


def test_manifest_files_and_directories(stubs: Stubs, new_session: SessionFactory) -> None:
    s = new_session(
        workspace=S.WorkspaceManifest(
            id="m1",
            files=[
                S.ManifestFile(path="src/main.py", content=b"print(1)\n", mode=0o755),
                S.ManifestFile(path="/workspace/README", content=b"hi"),
            ],
            directories=["out/logs"],
        )
    )
    assert s.workspace_id == "m1"
    r = run(stubs, s.session_id, "cat", "src/main.py", "README")
    assert r.stdout == b"print(1)\nhi"
    # Owned by the session's own host uid (which has no name in the image's /etc/passwd).
    r = run(stubs, s.session_id, "stat", "-c", "%a %u", "src/main.py", "out/logs", "README")
    uid = s.user.partition(":")[0]
    assert r.stdout.decode().split("\n")[:3] == [f"755 {uid}", f"755 {uid}", f"644 {uid}"]


def test_caller_chosen_id_is_idempotent(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = "idem-" + secrets.token_hex(4)
    first = new_session(session_id=sid, env={"A": "1"})
    again = new_session(session_id=sid, env={"A": "1"})
    assert again.session_id == sid and again.fingerprint == first.fingerprint
    assert again.created_at == first.created_at
    expect_error(
        lambda: new_session(session_id=sid, env={"A": "2"}),
        grpc.StatusCode.ALREADY_EXISTS,
        "SESSION_ALREADY_EXISTS",
    )


def test_fingerprint_covers_security_settings(new_session: SessionFactory) -> None:
    a = new_session()
    b = new_session(limits=common_pb2.ResourceLimits(pids=32))
    c = new_session(user="1000:1000")
    d = new_session()
    assert len({a.fingerprint, b.fingerprint, c.fingerprint}) == 3
    assert a.fingerprint == d.fingerprint


def test_list_with_labels_and_pages(stubs: Stubs, new_session: SessionFactory) -> None:
    tag = secrets.token_hex(4)
    ids = {new_session(labels={"batch": tag, "n": str(i)}).session_id for i in range(5)}
    new_session(labels={"batch": "other"})
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        resp = stubs.sessions.ListSessions(
            S.ListSessionsRequest(label_selector={"batch": tag}, page_size=2, page_token=token)
        )
        pages += 1
        assert len(resp.sessions) <= 2
        seen += [s.session_id for s in resp.sessions]
        token = resp.next_page_token
        if not token:
            break
    assert sorted(seen) == sorted(ids) and pages == 3
    one = stubs.sessions.ListSessions(
        S.ListSessionsRequest(label_selector={"batch": tag, "n": "3"})
    ).sessions
    assert [s.labels["n"] for s in one] == ["3"]


def test_list_rejects_bad_token_and_page_size(stubs: Stubs) -> None:
    expect_error(
        lambda: stubs.sessions.ListSessions(S.ListSessionsRequest(page_token="!!garbage")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )
    expect_error(
        lambda: stubs.sessions.ListSessions(S.ListSessionsRequest(page_size=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_SIZE",
    )


def test_renew_lease(stubs: Stubs, new_session: SessionFactory) -> None:
    s = new_session(lease_ttl=duration_pb2.Duration(seconds=60))
    renewed = stubs.sessions.RenewLease(
        S.RenewLeaseRequest(session_id=s.session_id, ttl=duration_pb2.Duration(seconds=3600))
    ).session
    assert renewed.lease_expires_at.seconds - s.lease_expires_at.seconds >= 3500
    expect_error(
        lambda: stubs.sessions.RenewLease(
            S.RenewLeaseRequest(session_id=s.session_id, ttl=duration_pb2.Duration(seconds=10**7))
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "LIMIT_EXCEEDS_MAXIMUM",
    )
    expect_error(
        lambda: stubs.sessions.RenewLease(S.RenewLeaseRequest(session_id="nope-" + "x" * 8)),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    )


def test_expired_lease_is_removed_never_emptied(
    stubs: Stubs, server: ServerProcess, new_session: SessionFactory
) -> None:
    s = new_session(lease_ttl=duration_pb2.Duration(seconds=1))

    def expired() -> bool:
        got = stubs.sessions.GetSession(S.GetSessionRequest(session_id=s.session_id)).session
        return got.state == S.SESSION_STATE_EXPIRED

    assert wait_until(expired, timeout=10)
    assert _container_state(s.session_id, server.owner_id) == ""
    expect_error(
        lambda: run(stubs, s.session_id, "true"),
        grpc.StatusCode.FAILED_PRECONDITION,
        "LEASE_EXPIRED",
    )
    expect_error(
        lambda: stubs.sessions.RenewLease(S.RenewLeaseRequest(session_id=s.session_id)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "LEASE_EXPIRED",
    )


@pytest.mark.parametrize(
    ("fields", "reason", "named"),
    [
        (
            {"limits": common_pb2.ResourceLimits(memory_bytes=64 * 2**30)},
            "LIMIT_EXCEEDS_MAXIMUM",
            "memory_bytes",
        ),
        (
            {"limits": common_pb2.ResourceLimits(cpu_millis=999_999)},
            "LIMIT_EXCEEDS_MAXIMUM",
            "cpu_millis",
        ),
        ({"limits": common_pb2.ResourceLimits(pids=100_000)}, "LIMIT_EXCEEDS_MAXIMUM", "pids"),
        (
            {"limits": common_pb2.ResourceLimits(workspace_bytes=2**40)},
            "LIMIT_EXCEEDS_MAXIMUM",
            "workspace_bytes",
        ),
        (
            {"limits": common_pb2.ResourceLimits(file_bytes=2**40)},
            "LIMIT_EXCEEDS_MAXIMUM",
            "file_bytes",
        ),
        (
            {"limits": common_pb2.ResourceLimits(output_bytes=2**40)},
            "LIMIT_EXCEEDS_MAXIMUM",
            "output_bytes",
        ),
        (
            {
                "limits": common_pb2.ResourceLimits(
                    command_timeout=duration_pb2.Duration(seconds=10**6)
                )
            },
            "LIMIT_EXCEEDS_MAXIMUM",
            "command_timeout",
        ),
        ({"limits": common_pb2.ResourceLimits(pids=-1)}, "LIMIT_INVALID", "pids"),
        ({"limits": common_pb2.ResourceLimits(memory_bytes=1024)}, "LIMIT_INVALID", "memory_bytes"),
        ({"lease_ttl": duration_pb2.Duration(seconds=10**7)}, "LIMIT_EXCEEDS_MAXIMUM", "lease_ttl"),
        ({"lease_ttl": duration_pb2.Duration(seconds=-5)}, "LEASE_INVALID", "lease_ttl"),
        ({"user": "0:0"}, "INVALID_USER", "root"),
        ({"user": "root"}, "INVALID_USER", "root"),
        ({"user": "nobody"}, "INVALID_USER", "numeric"),
        ({"user": "1000"}, "INVALID_USER", "gid"),
        ({"session_id": "Bad Id!"}, "INVALID_SESSION_ID", ""),
        ({"env": {"1BAD": "x"}}, "INVALID_ENV", ""),
        ({"env": {"HTTP_PROXY": "http://evil"}}, "ENV_RESERVED", ""),
        ({"labels": {"": "x"}}, "INVALID_LABELS", ""),
        (
            # ALLOWLIST with nothing allowed (tests/test_egress_*.py cover the rest)
            {"network": common_pb2.NetworkPolicy(mode=common_pb2.NETWORK_MODE_ALLOWLIST)},
            "NETWORK_POLICY_INVALID",
            "",
        ),
        (
            {"network": common_pb2.NetworkPolicy(allowed_domains=["example.com"])},
            "NETWORK_POLICY_INVALID",
            "",
        ),
        ({"shell": common_pb2.ShellPolicy(allow=["/bin/sh"])}, "INVALID_SHELL", ""),
        (
            {"workspace": S.WorkspaceManifest(files=[S.ManifestFile(path="../x")])},
            "PATH_OUTSIDE_WORKSPACE",
            "",
        ),
        (
            {"workspace": S.WorkspaceManifest(files=[S.ManifestFile(path="/etc/passwd")])},
            "PATH_OUTSIDE_WORKSPACE",
            "",
        ),
        ({"workspace": S.WorkspaceManifest(files=[S.ManifestFile(path="")])}, "PATH_INVALID", ""),
        (
            {"workspace": S.WorkspaceManifest(directories=["a/../../b"])},
            "PATH_OUTSIDE_WORKSPACE",
            "",
        ),
        (
            {
                "workspace": S.WorkspaceManifest(
                    files=[S.ManifestFile(path="a"), S.ManifestFile(path="a")]
                )
            },
            "INVALID_MANIFEST",
            "twice",
        ),
        (
            {
                "workspace": S.WorkspaceManifest(
                    files=[S.ManifestFile(path="a"), S.ManifestFile(path="a/b")]
                )
            },
            "INVALID_MANIFEST",
            "directory",
        ),
    ],
)
def test_create_rejects_bad_input(
    stubs: Stubs, server: ServerProcess, fields: dict[str, object], reason: str, named: str
) -> None:
    before = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=io.sandboxd.owner={server.owner_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    err = expect_error(
        lambda: stubs.sessions.CreateSession(S.CreateSessionRequest(**fields)),  # type: ignore[arg-type]
        grpc.StatusCode.INVALID_ARGUMENT,
        reason,
    )
    assert named in err.details()  # type: ignore[attr-defined]
    after = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=io.sandboxd.owner={server.owner_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert sorted(after) == sorted(before), "a refused create left a container behind"


def test_manifest_file_over_cap_is_resource_exhausted(stubs: Stubs) -> None:
    big = S.ManifestFile(path="big", content=b"x" * (1024 * 1024 + 1))
    expect_error(
        lambda: stubs.sessions.CreateSession(
            S.CreateSessionRequest(workspace=S.WorkspaceManifest(files=[big]))
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "FILE_TOO_LARGE",
    )


def test_missing_image_is_failed_precondition(stubs: Stubs) -> None:
    expect_error(
        lambda: stubs.sessions.CreateSession(
            S.CreateSessionRequest(
                image="sandboxd-runtime:no-such-image", pull_policy=images_pb2.PULL_POLICY_NEVER
            )
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "IMAGE_NOT_FOUND",
    )


def test_unknown_session_is_not_found(stubs: Stubs) -> None:
    for call in (
        lambda: stubs.sessions.GetSession(S.GetSessionRequest(session_id="missing-1")),
        lambda: run(stubs, "missing-1", "true"),
    ):
        expect_error(call, grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")


def test_restarted_server_knows_its_sessions(tmp_path: Path) -> None:
    owner = "restart" + secrets.token_hex(3)
    first = start_server(tmp_path, owner)
    try:
        stubs = make_stubs(first.address)
        s = stubs.sessions.CreateSession(
            S.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow=["sh", "cat"]))
        ).session
        run(stubs, s.session_id, "sh", "-c", "echo kept > note")
        stubs.channel.close()
        assert first.stop() == 0, first.log()

        second = start_server(tmp_path, owner)
        try:
            stubs = make_stubs(second.address)
            got = stubs.sessions.GetSession(S.GetSessionRequest(session_id=s.session_id)).session
            assert got.state == S.SESSION_STATE_RUNNING and got.fingerprint == s.fingerprint
            assert run(stubs, s.session_id, "cat", "note").stdout == b"kept\n"
            stubs.sessions.DeleteSession(S.DeleteSessionRequest(session_id=s.session_id))
            stubs.channel.close()
        finally:
            second.stop()
    finally:
        first.stop()
        remove_owned_containers(owner)
