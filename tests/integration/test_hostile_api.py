"""Hostile input, API abuse (SECURITY.md "API"): every request field bounded, every answer typed.

Each case also passes the `guard`: the server stays healthy and the bystander session is intact.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable

import grpc
import pytest
from conftest import Stubs, error_info, expect_error
from google.protobuf import duration_pb2
from sandboxd.v1 import (
    common_pb2,
    filesystem_pb2,
    images_pb2,
    process_pb2,
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

S, F, P, N = session_pb2, filesystem_pb2, process_pb2, snapshot_pb2
pytestmark = pytest.mark.usefixtures("guard")
INVALID = grpc.StatusCode.INVALID_ARGUMENT
MiB = 1024 * 1024

BAD_IDS = ["../x", "A", "a" * 64, "a\n", "-a", "a/b", "a b", "é", ".a", "a\x00"]


@pytest.mark.parametrize("sid", BAD_IDS, ids=[repr(s)[:12] for s in BAD_IDS])
def test_bad_session_id_is_refused_everywhere(stubs: Stubs, sid: str) -> None:
    calls: list[Callable[[], object]] = [
        lambda: stubs.sessions.CreateSession(S.CreateSessionRequest(session_id=sid)),
        lambda: stubs.sessions.GetSession(S.GetSessionRequest(session_id=sid)),
        lambda: stubs.sessions.DeleteSession(S.DeleteSessionRequest(session_id=sid)),
        lambda: stubs.processes.Run(P.RunRequest(session_id=sid, argv=["true"])),
        lambda: stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path="a")),
    ]
    for call in calls:
        expect_error(call, INVALID, "INVALID_SESSION_ID")


BAD_CREATE: list[tuple[str, dict[str, object], grpc.StatusCode, str]] = [
    ("labels-count", {"labels": {f"k{i}": "v" for i in range(65)}}, INVALID, "INVALID_LABELS"),
    ("label-key-dash", {"labels": {"-a": "v"}}, INVALID, "INVALID_LABELS"),
    ("label-key-long", {"labels": {"a" * 129: "v"}}, INVALID, "INVALID_LABELS"),
    ("label-key-space", {"labels": {"a b": "v"}}, INVALID, "INVALID_LABELS"),
    ("label-value-long", {"labels": {"k": "v" * 257}}, INVALID, "INVALID_LABELS"),
    ("label-value-newline", {"labels": {"k": "a\nb"}}, INVALID, "INVALID_LABELS"),
    ("label-value-bidi", {"labels": {"k": "\u202eabc"}}, INVALID, "INVALID_LABELS"),
    ("user-0:0", {"user": "0:0"}, INVALID, "INVALID_USER"),
    ("user-root", {"user": "root"}, INVALID, "INVALID_USER"),
    ("user-uid-only", {"user": "1000"}, INVALID, "INVALID_USER"),
    ("user-gid-0", {"user": "1000:0"}, INVALID, "INVALID_USER"),
    ("user-00", {"user": "00:1000"}, INVALID, "INVALID_USER"),
    ("user-names", {"user": "nobody:nogroup"}, INVALID, "INVALID_USER"),
    ("user-negative", {"user": "-1:-1"}, INVALID, "INVALID_USER"),
    ("user-overflow", {"user": "4294967296:1"}, INVALID, "INVALID_USER"),
    (
        "memory-over-max",
        {"limits": common_pb2.ResourceLimits(memory_bytes=1 << 40)},
        INVALID,
        "LIMIT_EXCEEDS_MAXIMUM",
    ),
    (
        "memory-tiny",
        {"limits": common_pb2.ResourceLimits(memory_bytes=1024)},
        INVALID,
        "LIMIT_INVALID",
    ),
    (
        "pids-over-max",
        {"limits": common_pb2.ResourceLimits(pids=100_000)},
        INVALID,
        "LIMIT_EXCEEDS_MAXIMUM",
    ),
    (
        "cpu-over-max",
        {"limits": common_pb2.ResourceLimits(cpu_millis=1_000_000)},
        INVALID,
        "LIMIT_EXCEEDS_MAXIMUM",
    ),
    (
        "lease-over-max",
        {"lease_ttl": duration_pb2.Duration(seconds=10**8)},
        INVALID,
        "LIMIT_EXCEEDS_MAXIMUM",
    ),
    ("lease-negative", {"lease_ttl": duration_pb2.Duration(seconds=-5)}, INVALID, "LEASE_INVALID"),
    ("image-nul", {"image": "busybox\x00"}, INVALID, "INVALID_IMAGE"),
    ("image-long", {"image": "a" * 600}, INVALID, "INVALID_IMAGE"),
    (
        "image-missing",
        {"image": "sandboxd-runtime:no-such-image", "pull_policy": images_pb2.PULL_POLICY_NEVER},
        grpc.StatusCode.FAILED_PRECONDITION,
        "IMAGE_NOT_FOUND",
    ),
    ("allow-path", {"shell": common_pb2.ShellPolicy(allow=["/bin/sh"])}, INVALID, "INVALID_SHELL"),
    ("allow-empty", {"shell": common_pb2.ShellPolicy(allow=[""])}, INVALID, "INVALID_SHELL"),
    (
        "allow-count",
        {"shell": common_pb2.ShellPolicy(allow=[f"c{i}" for i in range(257)])},
        INVALID,
        "INVALID_SHELL",
    ),
    ("allow-long", {"shell": common_pb2.ShellPolicy(allow=["a" * 256])}, INVALID, "INVALID_SHELL"),
    ("env-reserved", {"env": {"HTTPS_PROXY": "http://evil"}}, INVALID, "ENV_RESERVED"),
    ("env-key", {"env": {"A B": "1"}}, INVALID, "INVALID_ENV"),
    (
        "manifest-escape",
        {"workspace": S.WorkspaceManifest(files=[S.ManifestFile(path="../x")])},
        INVALID,
        "PATH_OUTSIDE_WORKSPACE",
    ),
    (
        "manifest-absolute",
        {"workspace": S.WorkspaceManifest(files=[S.ManifestFile(path="/etc/cron.d/x")])},
        INVALID,
        "PATH_OUTSIDE_WORKSPACE",
    ),
    (
        "manifest-duplicate",
        {"workspace": S.WorkspaceManifest(files=[S.ManifestFile(path="x")] * 2)},
        INVALID,
        "INVALID_MANIFEST",
    ),
    (
        "manifest-file-as-dir",
        {
            "workspace": S.WorkspaceManifest(
                files=[S.ManifestFile(path="x"), S.ManifestFile(path="x/y")]
            )
        },
        INVALID,
        "INVALID_MANIFEST",
    ),
    (
        "manifest-mode",
        {"workspace": S.WorkspaceManifest(files=[S.ManifestFile(path="x", mode=0o777777)])},
        INVALID,
        "INVALID_MODE",
    ),
    (
        "manifest-count",
        {"workspace": S.WorkspaceManifest(directories=[f"d{i}" for i in range(10_001)])},
        INVALID,
        "MANIFEST_TOO_LARGE",
    ),
    ("manifest-id", {"workspace": S.WorkspaceManifest(id="i" * 257)}, INVALID, "INVALID_MANIFEST"),
    (
        "manifest-file-cap",
        {
            "workspace": S.WorkspaceManifest(
                files=[S.ManifestFile(path="x", content=b"x" * 2 * MiB)]
            )
        },
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "FILE_TOO_LARGE",
    ),
    (
        "manifest-workspace-cap",
        {
            "limits": common_pb2.ResourceLimits(workspace_bytes=1 * MiB),
            "workspace": S.WorkspaceManifest(
                files=[S.ManifestFile(path=f"f{i}", content=b"x" * 900_000) for i in range(2)]
            ),
        },
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "WORKSPACE_FULL",
    ),
    (
        "network-without-allowlist",
        {"network": common_pb2.NetworkPolicy(allowed_domains=["x" * 1000])},
        INVALID,
        "NETWORK_POLICY_INVALID",
    ),
]


@pytest.mark.parametrize(
    ("fields", "code", "reason"), [c[1:] for c in BAD_CREATE], ids=[c[0] for c in BAD_CREATE]
)
def test_bad_create_is_refused_and_creates_nothing(
    stubs: Stubs, fields: dict[str, object], code: grpc.StatusCode, reason: str
) -> None:
    before = {s.session_id for s in stubs.sessions.ListSessions(S.ListSessionsRequest()).sessions}
    expect_error(
        lambda: stubs.sessions.CreateSession(S.CreateSessionRequest(**fields)),  # type: ignore[arg-type]
        code,
        reason,
    )
    after = {s.session_id for s in stubs.sessions.ListSessions(S.ListSessionsRequest()).sessions}
    assert after == before


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (S.ListSessionsRequest(page_size=-1), "INVALID_PAGE_SIZE"),
        (S.ListSessionsRequest(page_token="!!!not-base64"), "INVALID_PAGE_TOKEN"),
        (
            S.ListSessionsRequest(page_token=base64.urlsafe_b64encode(b"../../x").decode()),
            "INVALID_PAGE_TOKEN",
        ),
        (S.ListSessionsRequest(page_token="A" * 10_000), "INVALID_PAGE_TOKEN"),
        (S.ListSessionsRequest(label_selector={"bad key": "v"}), "INVALID_LABELS"),
        (S.ListSessionsRequest(label_selector={"k": "\x00"}), "INVALID_LABELS"),
    ],
    ids=["negative-size", "garbage-token", "forged-token", "huge-token", "selector", "nul"],
)
def test_bad_list_requests(stubs: Stubs, request_: S.ListSessionsRequest, reason: str) -> None:
    expect_error(lambda: stubs.sessions.ListSessions(request_), INVALID, reason)


def test_renew_with_bad_ttl(stubs: Stubs, victim: str) -> None:
    for ttl, reason in ((-5, "LEASE_INVALID"), (10**8, "LIMIT_EXCEEDS_MAXIMUM")):
        expect_error(
            lambda ttl=ttl: stubs.sessions.RenewLease(
                S.RenewLeaseRequest(session_id=victim, ttl=duration_pb2.Duration(seconds=ttl))
            ),
            INVALID,
            reason,
        )


def test_unknown_session_is_not_found_on_every_rpc(stubs: Stubs) -> None:
    sid = "no-such-session"
    calls: list[Callable[[], object]] = [
        lambda: stubs.sessions.GetSession(S.GetSessionRequest(session_id=sid)),
        lambda: stubs.sessions.RenewLease(S.RenewLeaseRequest(session_id=sid)),
        lambda: stubs.processes.Run(P.RunRequest(session_id=sid, argv=["true"])),
        lambda: stubs.processes.Exec(P.ExecRequest(session_id=sid, argv=["true"])),
        lambda: stubs.files.ReadFile(F.ReadFileRequest(session_id=sid, path="a")),
        lambda: stubs.files.ListDir(F.ListDirRequest(session_id=sid)),
    ]
    for call in calls:
        expect_error(call, grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")


def test_oversized_message_is_refused_by_the_transport(stubs: Stubs, victim: str) -> None:
    err = expect_error(
        lambda: stubs.files.WriteFile(
            F.WriteFileRequest(session_id=victim, path="big", content=b"x" * (20 * MiB))
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    assert "larger than max" in err.details()  # type: ignore[attr-defined]


def test_file_over_the_cap_is_refused(stubs: Stubs, victim: str) -> None:
    expect_error(
        lambda: stubs.files.WriteFile(
            F.WriteFileRequest(session_id=victim, path="big", content=b"x" * (2 * MiB))
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "FILE_TOO_LARGE",
    )


def test_oversized_metadata_is_refused(stubs: Stubs, victim: str) -> None:
    expect_error(
        lambda: stubs.sessions.GetSession(
            S.GetSessionRequest(session_id=victim), metadata=[("x-big", "a" * 20_000)]
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )


@pytest.mark.parametrize(
    "payload", [b"\xff\xff\xff\xff\x0f", b"\x0a\xff\xff\xff\xff\x0f", b"\x0a\x05ab"]
)
def test_undecodable_request_is_refused(stubs: Stubs, payload: bytes) -> None:
    raw = stubs.channel.unary_unary(
        "/sandboxd.v1.SessionService/GetSession",
        request_serializer=lambda x: x,
        response_deserializer=lambda x: x,
    )
    with pytest.raises(grpc.RpcError) as excinfo:
        raw(payload)
    # grpc refuses the bytes before any servicer runs
    assert excinfo.value.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)  # type: ignore[attr-defined]


def test_unknown_method_is_unimplemented(stubs: Stubs) -> None:
    raw = stubs.channel.unary_unary(
        "/sandboxd.v1.SessionService/DropAllTables",
        request_serializer=lambda x: x,
        response_deserializer=lambda x: x,
    )
    with pytest.raises(grpc.RpcError) as excinfo:
        raw(b"")
    assert excinfo.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]


def test_parallel_garbage_does_not_disturb_the_server(stubs: Stubs) -> None:
    reasons: list[str] = []

    def hammer() -> None:
        for i in range(20):
            try:
                stubs.sessions.GetSession(S.GetSessionRequest(session_id=f"missing-{i}"))
            except grpc.RpcError as err:
                reasons.append(error_info(err).reason)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert reasons == ["SESSION_NOT_FOUND"] * 160


Call = Callable[[Stubs, str], object]


def _snap(s: Stubs) -> snapshot_pb2_grpc.SnapshotServiceStub:
    return snapshot_pb2_grpc.SnapshotServiceStub(s.channel)


# Processes, snapshots, archives, egress: the RPCs other parts of the server added.
BAD_OTHER: list[tuple[str, Call, grpc.StatusCode, str]] = [
    (
        "signal-name",
        lambda s, v: s.processes.SignalProcess(
            P.SignalProcessRequest(session_id=v, process_id="p1", signal="SIGNOPE")
        ),
        INVALID,
        "INVALID_SIGNAL",
    ),
    (
        "signal-huge",
        lambda s, v: s.processes.SignalProcess(
            P.SignalProcessRequest(session_id=v, process_id="p1", signal="X" * 100_000)
        ),
        INVALID,
        "INVALID_SIGNAL",
    ),
    (
        "signal-unknown-process",
        lambda s, v: s.processes.SignalProcess(
            P.SignalProcessRequest(session_id=v, process_id="nope", signal="SIGKILL")
        ),
        grpc.StatusCode.NOT_FOUND,
        "PROCESS_NOT_FOUND",
    ),
    (
        "process-id",
        lambda s, v: s.processes.StartProcess(
            P.StartProcessRequest(session_id=v, process_id="../x", argv=["true"])
        ),
        INVALID,
        "INVALID_PROCESS_ID",
    ),
    (
        "attach-negative-offset",
        lambda s, v: s.processes.AttachProcess(
            P.AttachProcessRequest(session_id=v, process_id="p1", stdout_offset=-5)
        ),
        INVALID,
        "INVALID_OFFSET",
    ),
    (
        "interact-without-start",
        lambda s, v: s.processes.Interact(
            iter([P.InteractRequest(stdin=P.InteractStdin(data=b"x"))])
        ),
        INVALID,
        "INVALID_FIRST_MESSAGE",
    ),
    (
        "interact-empty",
        lambda s, v: s.processes.Interact(iter([])),
        INVALID,
        "INVALID_FIRST_MESSAGE",
    ),
    (
        "egress-token-huge",
        lambda s, v: s.sessions.ListEgressEvents(
            S.ListEgressEventsRequest(session_id=v, page_token="9" * 5000)
        ),
        INVALID,
        "INVALID_PAGE_TOKEN",
    ),
    (
        "snapshot-labels",
        lambda s, v: _snap(s).CreateSnapshot(
            N.CreateSnapshotRequest(session_id=v, labels={"bad key": "v"})
        ),
        INVALID,
        "INVALID_LABELS",
    ),
    (
        "snapshot-id-huge",
        lambda s, v: _snap(s).GetSnapshot(N.GetSnapshotRequest(snapshot_id="x" * 100_000)),
        grpc.StatusCode.NOT_FOUND,
        "SNAPSHOT_NOT_FOUND",
    ),
    (
        "snapshot-token",
        lambda s, v: _snap(s).ListSnapshots(N.ListSnapshotsRequest(page_token="!!")),
        INVALID,
        "INVALID_PAGE_TOKEN",
    ),
    (
        "fork-traversal-id",
        lambda s, v: s.sessions.CreateSession(S.CreateSessionRequest(from_snapshot_id="../../x")),
        grpc.StatusCode.NOT_FOUND,
        "SNAPSHOT_NOT_FOUND",
    ),
    (
        "resume-huge-fingerprint",
        lambda s, v: s.sessions.ResumeSession(
            S.ResumeSessionRequest(session_id=v, expected_fingerprint="f" * 100_000)
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "MANIFEST_CONFLICT",
    ),
    (
        "export-outside",
        lambda s, v: _snap(s).ExportArchive(N.ExportArchiveRequest(session_id=v, path="../")),
        INVALID,
        "PATH_OUTSIDE_WORKSPACE",
    ),
    (
        "import-without-header",
        lambda s, v: _snap(s).ImportArchive(iter([N.ImportArchiveRequest(data=b"x")])),
        INVALID,
        "ARCHIVE_HEADER_INVALID",
    ),
]


@pytest.mark.parametrize(
    ("call", "code", "reason"), [c[1:] for c in BAD_OTHER], ids=[c[0] for c in BAD_OTHER]
)
def test_bad_requests_to_processes_snapshots_and_archives(
    stubs: Stubs, victim: str, call: Call, code: grpc.StatusCode, reason: str
) -> None:
    stubs.processes.StartProcess(
        P.StartProcessRequest(session_id=victim, process_id="p1", argv=["sleep", "60"])
    )
    expect_error(lambda: call(stubs, victim), code, reason)
