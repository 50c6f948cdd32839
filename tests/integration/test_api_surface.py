"""What every client relies on besides the sandboxd.v1 RPCs: health, reflection (v1alpha for
grpcurl 1.8, v1 for newer tools), and the google.rpc.ErrorInfo detail on every error."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from conftest import (
    REPO,
    ServerProcess,
    SessionFactory,
    Stubs,
    error_info,
    run,
    wait_until,
)
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from sandboxd.v1 import common_pb2, filesystem_pb2, images_pb2, process_pb2, session_pb2

# The public contract (API.md): typed out here, not read from the server's own tables.
SANDBOXD_SERVICES = {
    "sandboxd.v1.SessionService",
    "sandboxd.v1.ProcessService",
    "sandboxd.v1.FilesystemService",
    "sandboxd.v1.AdminService",
}
STANDARD_SERVICES = {
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
}
GRPCURL = str(Path(sys.executable).parent / "grpcurl")


def grpcurl(address: str, *args: str) -> str:
    proc = subprocess.run(
        [GRPCURL, "-plaintext", address, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# ----- health --------------------------------------------------------------------------------


@pytest.mark.parametrize("service", ["", *sorted(SANDBOXD_SERVICES)])
def test_health_serving(stubs: Stubs, service: str) -> None:
    health = health_pb2_grpc.HealthStub(stubs.channel)
    resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_health_unknown_service_not_found(stubs: Stubs) -> None:
    health = health_pb2_grpc.HealthStub(stubs.channel)
    with pytest.raises(grpc.RpcError) as excinfo:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
    assert excinfo.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]


# ----- reflection ----------------------------------------------------------------------------


def test_grpcurl_lists_every_service(server: ServerProcess) -> None:
    listed = set(grpcurl(server.address, "list").split())
    assert SANDBOXD_SERVICES <= listed
    assert STANDARD_SERVICES <= listed


def test_grpcurl_describes_session_service(server: ServerProcess) -> None:
    out = grpcurl(server.address, "describe", "sandboxd.v1.SessionService")
    assert "sandboxd.v1.SessionService is a service:" in out
    for rpc in ("CreateSession", "GetSession", "ListSessions", "RenewLease", "DeleteSession"):
        assert re.search(rf"rpc {rpc} \( \.sandboxd\.v1\.{rpc}Request \)", out), out
    # a message from another file resolves too (the dependency chain is served)
    out = grpcurl(server.address, "describe", "sandboxd.v1.ResourceLimits")
    assert "memory_bytes" in out and "google.protobuf.Duration command_timeout" in out


def _reflect_v1(
    channel: grpc.Channel, *requests: reflection_pb2.ServerReflectionRequest
) -> list[reflection_pb2.ServerReflectionResponse]:
    """grpc.reflection.v1 over a raw stream: its messages are wire-identical to v1alpha's."""
    call = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    return list(call(iter(requests), timeout=10))


def test_reflection_v1_lists_services(stubs: Stubs) -> None:
    (resp,) = _reflect_v1(stubs.channel, reflection_pb2.ServerReflectionRequest(list_services=""))
    assert resp.WhichOneof("message_response") == "list_services_response"
    names = {s.name for s in resp.list_services_response.service}
    assert SANDBOXD_SERVICES <= names
    assert STANDARD_SERVICES <= names


def test_reflection_v1_serves_descriptors(stubs: Stubs) -> None:
    (resp,) = _reflect_v1(
        stubs.channel,
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="sandboxd.v1.ProcessService"),
    )
    assert resp.WhichOneof("message_response") == "file_descriptor_response"
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in resp.file_descriptor_response.file_descriptor_proto
    ]
    process = next(f for f in files if f.name == "sandboxd/v1/process.proto")
    assert process.package == "sandboxd.v1"
    methods = {m.name for s in process.service if s.name == "ProcessService" for m in s.method}
    assert {"Exec", "Run"} <= methods


BUF = REPO / "clients" / "node" / "node_modules" / ".bin" / "buf"


def test_grpcurl_describes_every_service_and_the_error_reasons(server: ServerProcess) -> None:
    """Every listed service resolves, the reflection ones included (newer tools stopped at
    "Symbol not found: grpc.reflection.v1.ServerReflection"), and so does a type no service
    names: the ErrorReason enum callers branch on."""
    for name in grpcurl(server.address, "list").split():
        out = grpcurl(server.address, "describe", name)
        assert f"{name} is a service:" in out, out
    out = grpcurl(server.address, "describe", "sandboxd.v1.ErrorReason")
    assert "ERROR_REASON_SESSION_NOT_FOUND" in out


def test_buf_curl_lists_every_method_and_calls_one(server: ServerProcess) -> None:
    if not BUF.exists():
        pytest.skip("buf is installed by `make node-deps` (clients/node/node_modules)")
    base = ["--protocol", "grpc", "--http2-prior-knowledge"]
    url = f"http://{server.address}"
    listed = subprocess.run(
        [str(BUF), "curl", "--list-methods", *base, url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    methods = set(listed.stdout.split())
    assert "sandboxd.v1.ProcessService/Run" in methods
    assert "grpc.health.v1.Health/List" in methods
    called = subprocess.run(
        [str(BUF), "curl", *base, "-d", "{}", f"{url}/sandboxd.v1.AdminService/GetServerInfo"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert called.returncode == 0, called.stderr
    assert '"version"' in called.stdout


def test_health_list_names_every_service(stubs: Stubs) -> None:
    """Health/List answers (it was UNIMPLEMENTED with a Python exception text)."""
    health = health_pb2_grpc.HealthStub(stubs.channel)
    resp = health.List(health_pb2.HealthListRequest(), timeout=10)
    assert set(resp.statuses) >= {"", *SANDBOXD_SERVICES}
    assert resp.statuses[""].status == health_pb2.HealthCheckResponse.SERVING


# ----- error details -------------------------------------------------------------------------


def _documented_reasons() -> dict[str, set[str]]:
    """docs/errors.md's "Error reasons" table (reason | gRPC code | ...): code -> its reasons."""
    text = (REPO / "docs" / "errors.md").read_text()
    section = text.split("## Error reasons", 1)[1].split("\n## ", 1)[0]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and all(re.fullmatch(r"`[A-Z_]+`", c) for c in cells[:2]):
            table.setdefault(cells[1].strip("`"), set()).add(cells[0].strip("`"))
    assert table, "no error table found in docs/errors.md"
    return table


ErrorCase = Callable[[Stubs, str], object]

S, P, F = session_pb2, process_pb2, filesystem_pb2

# One call per kind of failure, through each servicer wrapper (unary and stream).
ERROR_CASES: list[tuple[str, ErrorCase, grpc.StatusCode, str]] = [
    (
        "bad session id",
        lambda s, sid: s.sessions.GetSession(S.GetSessionRequest(session_id="Bad Id!")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_SESSION_ID",
    ),
    (
        "unknown session",
        lambda s, sid: s.sessions.GetSession(S.GetSessionRequest(session_id="no-such-session")),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    ),
    (
        "unknown session (stream)",
        lambda s, sid: list(
            s.processes.Exec(P.ExecRequest(session_id="no-such-session", argv=["true"]))
        ),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    ),
    (
        "taken id, other manifest",
        lambda s, sid: s.sessions.CreateSession(
            S.CreateSessionRequest(session_id=sid, labels={"other": "x"}, user="1000:1000")
        ),
        grpc.StatusCode.ALREADY_EXISTS,
        "SESSION_ALREADY_EXISTS",
    ),
    (
        "invalid image name",
        lambda s, sid: s.sessions.CreateSession(S.CreateSessionRequest(image="Bad Image!!")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_IMAGE",
    ),
    (
        "cpu below the kernel's quota",
        lambda s, sid: s.sessions.CreateSession(
            S.CreateSessionRequest(limits=common_pb2.ResourceLimits(cpu_millis=5))
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "LIMIT_INVALID",
    ),
    (
        "missing image",
        lambda s, sid: s.sessions.CreateSession(
            S.CreateSessionRequest(
                image="sandboxd-runtime:no-such-image", pull_policy=images_pb2.PULL_POLICY_NEVER
            )
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "IMAGE_NOT_FOUND",
    ),
    (
        "command not allowed",
        lambda s, sid: run(s, sid, "rm", "-rf", "/workspace"),
        grpc.StatusCode.PERMISSION_DENIED,
        "COMMAND_NOT_ALLOWED",
    ),
    (
        "command not allowed (stream)",
        lambda s, sid: list(s.processes.Exec(P.ExecRequest(session_id=sid, argv=["rm", "x"]))),
        grpc.StatusCode.PERMISSION_DENIED,
        "COMMAND_NOT_ALLOWED",
    ),
    (
        "path outside workspace",
        lambda s, sid: s.files.ReadFile(F.ReadFileRequest(session_id=sid, path="../etc/passwd")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PATH_OUTSIDE_WORKSPACE",
    ),
    (
        "missing file",
        lambda s, sid: s.files.ReadFile(F.ReadFileRequest(session_id=sid, path="nothing-here")),
        grpc.StatusCode.NOT_FOUND,
        "FILE_NOT_FOUND",
    ),
    (
        "file over cap",
        lambda s, sid: s.files.WriteFile(
            F.WriteFileRequest(session_id=sid, path="big", content=b"x" * (1024 * 1024 + 1))
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "FILE_TOO_LARGE",
    ),
    (
        "bad page token",
        lambda s, sid: s.sessions.ListSessions(S.ListSessionsRequest(page_token="!!")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    ),
]


@pytest.fixture(scope="module")
def documented() -> dict[str, set[str]]:
    return _documented_reasons()


@pytest.mark.parametrize(
    ("call", "code", "reason"),
    [c[1:] for c in ERROR_CASES],
    ids=[c[0] for c in ERROR_CASES],
)
def test_every_error_carries_error_info(
    stubs: Stubs,
    new_session: SessionFactory,
    documented: dict[str, set[str]],
    call: ErrorCase,
    code: grpc.StatusCode,
    reason: str,
) -> None:
    sid = new_session(shell=common_pb2.ShellPolicy(allow=["true", "cat"])).session_id
    with pytest.raises(grpc.RpcError) as excinfo:
        call(stubs, sid)
    err = excinfo.value
    assert err.code() == code, err.details()  # type: ignore[attr-defined]
    info = error_info(err)
    assert info.domain == "sandboxd"
    assert info.reason == reason
    assert err.details()  # type: ignore[attr-defined]  # a message for people too
    # the README's table is the reference callers read: the reason must be listed there
    assert reason in documented[code.name], f"{reason} is not documented under {code.name}"


def test_documented_reasons_are_upper_snake(documented: dict[str, set[str]]) -> None:
    assert set(documented) <= {c.name for c in grpc.StatusCode}
    for reasons in documented.values():
        for reason in reasons:
            assert re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)*", reason)


@pytest.fixture
def broken_image(tmp_path: Path) -> Iterator[str]:
    """An image the engine cannot start a session container from: /workspace is a file."""
    name = f"sandboxd-runtime:test-broken-{secrets.token_hex(4)}"
    (tmp_path / "workspace").write_text("not a directory\n")
    tar = subprocess.Popen(["tar", "-C", str(tmp_path), "-c", "workspace"], stdout=subprocess.PIPE)
    assert tar.stdout is not None
    with tar.stdout:
        subprocess.run(
            ["docker", "import", "-", name], stdin=tar.stdout, check=True, capture_output=True
        )
    assert tar.wait() == 0
    yield name
    subprocess.run(["docker", "rmi", "-f", name], check=False, capture_output=True)


def test_internal_error_hides_details(
    stubs: Stubs, server: ServerProcess, broken_image: str
) -> None:
    """An engine answer the server did not expect: INTERNAL with a fixed message; what the
    engine said (host paths, runc output) goes to the server log only."""
    before = len(server.log_lines)
    with pytest.raises(grpc.RpcError) as excinfo:
        stubs.sessions.CreateSession(S.CreateSessionRequest(image=broken_image))
    err = excinfo.value
    assert err.code() == grpc.StatusCode.INTERNAL  # type: ignore[attr-defined]
    assert err.details() == "internal error; the server log has the details"  # type: ignore[attr-defined]
    info = error_info(err)
    assert (info.domain, info.reason) == ("sandboxd", "INTERNAL")
    assert not info.metadata
    assert wait_until(lambda: "not a directory" in "".join(server.log_lines[before:]), timeout=5)
    # the failed create left nothing behind: no session, no container
    listed = stubs.sessions.ListSessions(S.ListSessionsRequest(page_size=1000)).sessions
    assert broken_image not in {s.image for s in listed}
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"ancestor={broken_image}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert left == []
