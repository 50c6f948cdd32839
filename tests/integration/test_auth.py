"""Bearer-token authentication: the interceptor, the tokens file, and the listen-address guard."""

from __future__ import annotations

import hashlib
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from authutil import authed_stubs, write_tokens
from conftest import (
    HELPER,
    ServerProcess,
    Stubs,
    error_info,
    expect_error,
    own_server,
    run,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from sandboxd import tenancy
from sandboxd.api.auth import bearer_token
from sandboxd.config import load_config
from sandboxd.errors import ConfigError
from sandboxd.v1 import (
    admin_pb2,
    common_pb2,
    filesystem_pb2,
    process_pb2,
    session_pb2,
)

TOKEN_A = "alpha-" + secrets.token_urlsafe(24)
TOKEN_B = "beta-" + secrets.token_urlsafe(24)
U = grpc.StatusCode.UNAUTHENTICATED


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("auth")
    tokens = write_tokens(data / "tokens", {TOKEN_A: "alpha", TOKEN_B: "beta"})
    owner = "auth" + secrets.token_hex(4)
    with own_server(data / "data", owner, "--tokens-file", str(tokens)) as srv:
        yield srv


def _calls(s: Stubs) -> dict[str, Callable[[], object]]:
    """One call of every service and kind (unary, server stream)."""
    return {
        "ListSessions": lambda: s.sessions.ListSessions(session_pb2.ListSessionsRequest()),
        "CreateSession": lambda: s.sessions.CreateSession(session_pb2.CreateSessionRequest()),
        "GetSession": lambda: s.sessions.GetSession(session_pb2.GetSessionRequest(session_id="x")),
        "DeleteSession": lambda: s.sessions.DeleteSession(
            session_pb2.DeleteSessionRequest(session_id="x")
        ),
        "Run": lambda: s.processes.Run(process_pb2.RunRequest(session_id="x", argv=["true"])),
        "Exec": lambda: s.processes.Exec(process_pb2.ExecRequest(session_id="x", argv=["true"])),
        "ReadFile": lambda: s.files.ReadFile(
            filesystem_pb2.ReadFileRequest(session_id="x", path="a")
        ),
        "GetServerInfo": lambda: s.admin.GetServerInfo(admin_pb2.GetServerInfoRequest()),
    }


def test_no_token_is_unauthenticated_on_every_service(auth_server: ServerProcess) -> None:
    stubs = authed_stubs(auth_server.address, None)
    for name, call in _calls(stubs).items():
        err = expect_error(call, U, "TOKEN_MISSING")
        assert "Bearer" in err.details(), name  # type: ignore[attr-defined]
    stubs.channel.close()


@pytest.mark.parametrize(
    "header",
    [
        "Bearer " + secrets.token_urlsafe(24),  # nobody's token
        "Bearer " + TOKEN_A[:-1],  # one character short
        "Bearer " + TOKEN_A + "x",  # one character long
        "Bearer " + hashlib.sha256(TOKEN_A.encode()).hexdigest(),  # the stored digest itself
        "Bearer " + "a" * 5000,  # oversized
    ],
    ids=["unknown", "short", "long", "digest", "oversized"],
)
def test_wrong_token_is_unauthenticated(auth_server: ServerProcess, header: str) -> None:
    stubs = authed_stubs(auth_server.address, None, header=header)
    for call in _calls(stubs).values():
        expect_error(call, U, "TOKEN_INVALID")
    stubs.channel.close()


@pytest.mark.parametrize(
    "header",
    ["Basic " + TOKEN_A, TOKEN_A, "Bearer", "Bearer    ", "Token " + TOKEN_A],
    ids=["basic", "bare", "scheme-only", "blank", "other-scheme"],
)
def test_malformed_authorization_is_missing(auth_server: ServerProcess, header: str) -> None:
    stubs = authed_stubs(auth_server.address, None, header=header)
    expect_error(_calls(stubs)["ListSessions"], U, "TOKEN_MISSING")
    expect_error(_calls(stubs)["Exec"], U, "TOKEN_MISSING")
    stubs.channel.close()


def test_two_authorization_headers_are_refused(auth_server: ServerProcess) -> None:
    stubs = authed_stubs(auth_server.address, TOKEN_A)
    with pytest.raises(grpc.RpcError) as excinfo:
        stubs.sessions.ListSessions(
            session_pb2.ListSessionsRequest(), metadata=[("authorization", f"Bearer {TOKEN_B}")]
        )
    assert excinfo.value.code() == U  # type: ignore[attr-defined]
    assert error_info(excinfo.value).reason == "TOKEN_MISSING"
    stubs.channel.close()


def test_health_and_reflection_need_no_token(auth_server: ServerProcess) -> None:
    channel = grpc.insecure_channel(auth_server.address)
    health = health_pb2_grpc.HealthStub(channel)
    resp = health.Check(health_pb2.HealthCheckRequest(service=""))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = list(
        reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
    )
    names = {s.name for s in answers[0].list_services_response.service}
    assert "sandboxd.v1.SessionService" in names
    channel.close()


def test_valid_token_works_and_case_of_scheme_is_ignored(auth_server: ServerProcess) -> None:
    stubs = authed_stubs(auth_server.address, None, header="bearer " + TOKEN_A)
    created = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
    ).session
    try:
        assert created.session_id.startswith("alpha.")
        assert run(stubs, created.session_id, "echo", "hi").stdout == b"hi\n"
        events = list(
            stubs.processes.Exec(
                process_pb2.ExecRequest(session_id=created.session_id, argv=["echo", "streamed"])
            )
        )
        assert events[-1].WhichOneof("event") == "exited"
    finally:
        stubs.sessions.DeleteSession(
            session_pb2.DeleteSessionRequest(session_id=created.session_id)
        )
        stubs.channel.close()


def test_refusals_are_logged_without_the_token(auth_server: ServerProcess) -> None:
    stubs = authed_stubs(auth_server.address, None, header="Bearer secret-" + TOKEN_B[::-1])
    expect_error(_calls(stubs)["ListSessions"], U, "TOKEN_INVALID")
    stubs.channel.close()
    log = auth_server.log()
    assert "unknown token" in log
    assert TOKEN_B[::-1] not in log and TOKEN_A not in log


# --------------------------------------------------------------------------------------------
# Units: token table, header parsing, tokens file
# --------------------------------------------------------------------------------------------


def _table(**tokens: str) -> tenancy.TokenTable:
    return tenancy.TokenTable(
        tuple((tenant, hashlib.sha256(tok.encode()).digest()) for tenant, tok in tokens.items())
    )


def test_token_table_authenticates_each_tenant() -> None:
    table = _table(alpha="one", beta="two")
    assert table.authenticate("one") == "alpha"
    assert table.authenticate("two") == "beta"
    assert table.authenticate("three") is None
    assert table.authenticate("") is None
    assert table.authenticate("x" * 5000) is None
    assert table.authenticate("\udcff") is None  # not encodable text does not crash


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ((("authorization", "Bearer abc"),), "abc"),
        ((("Authorization", "BEARER abc "),), "abc"),
        ((("authorization", "Basic abc"),), None),
        ((("authorization", "Bearer "),), None),
        ((("authorization", "Bearer a"), ("authorization", "Bearer b")), None),
        ((("x-other", "Bearer abc"),), None),
        ((("authorization-bin", b"Bearer abc"),), None),
        (None, None),
    ],
)
def test_bearer_token_parsing(metadata: object, expected: str | None) -> None:
    assert bearer_token(metadata) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no 'tenant sha256hex' lines"),
        ("# only a comment\n", "no 'tenant sha256hex' lines"),
        ("alpha\n", "expected 'tenant sha256hex'"),
        ("alpha " + "0" * 64 + " extra\n", "unknown option 'extra'"),
        ("alpha " + "0" * 64 + " admin=yes\n", "unknown option 'admin=yes'"),
        ("alpha " + "0" * 64 + " egress_private_networks=maybe\n", "unknown option"),
        ("alpha " + "0" * 64 + " image_allowlist=Bad!\n", "image_allowlist"),
        ("Alpha " + "0" * 64 + "\n", "tenant 'Alpha'"),
        ("al.pha " + "0" * 64 + "\n", "tenant 'al.pha'"),
        ("a" * 33 + " " + "0" * 64 + "\n", "must be 1-32"),
        ("alpha plaintext-token\n", "not a sha256 hex digest"),
        ("alpha " + "0" * 63 + "\n", "not a sha256 hex digest"),
        ("alpha " + "g" * 64 + "\n", "not a sha256 hex digest"),
        (f"alpha {'1' * 64}\nbeta {'1' * 64}\n", "appears twice"),
    ],
)
def test_bad_tokens_files_stop_the_server(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        tenancy.load_tokens(path)


def test_tokens_file_options_grant_per_tenant(tmp_path: Path) -> None:
    """`admin`, `egress_private_networks=` and `image_allowlist=` after the digest; a tenant on
    several lines holds what any line grants; two-word lines grant nothing."""
    d = [hashlib.sha256(t.encode()).hexdigest() for t in ("a", "b", "c", "d")]
    path = tmp_path / "tokens"
    path.write_text(
        f"ops {d[0]} admin\n"
        f"alpha {d[1]} egress_private_networks=allow image_allowlist=python:3.*\n"
        f"alpha {d[2]} image_allowlist=127.0.0.1:5000/*\n"
        f"beta {d[3]}\n"
    )
    table = tenancy.load_tokens(path)
    assert table.authenticate("a") == "ops" and table.grants_of("ops").admin
    alpha = table.grants_of("alpha")
    assert not alpha.admin and alpha.private_networks is True
    assert alpha.image_allowlist == "python:3.*,127.0.0.1:5000/*"
    assert table.grants_of("beta") == tenancy.TenantGrants()
    assert tenancy.private_networks_allowed("deny", alpha)
    assert not tenancy.private_networks_allowed("deny", table.grants_of("beta"))
    assert tenancy.private_networks_allowed("allow", table.grants_of("beta"))


def test_tokens_file_comments_blank_lines_and_upper_case_hex(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"tok").hexdigest().upper()
    path = tmp_path / "tokens"
    path.write_text(f"# comment\n\n  alpha   {digest}  \n")
    assert tenancy.load_tokens(path).authenticate("tok") == "alpha"


def test_missing_tokens_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        tenancy.load_tokens(tmp_path / "nope")


# --------------------------------------------------------------------------------------------
# Listening beyond loopback needs authentication
# --------------------------------------------------------------------------------------------


def _load(*argv: str, env: dict[str, str] | None = None) -> object:
    return load_config(["--helper", str(HELPER), *argv], env=env or {})


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "[::]:50051", "192.0.2.10:50051"])
def test_public_listen_without_tokens_is_refused(listen: str) -> None:
    with pytest.raises(ConfigError, match="refusing to serve a non-loopback address"):
        _load("--listen", listen)


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "127.0.0.2:1", "[::1]:50051", "localhost:1"])
def test_loopback_needs_no_tokens(listen: str) -> None:
    _load("--listen", listen)


def test_public_listen_with_tokens_or_override_is_accepted(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens", {"t": "alpha"})
    _load("--listen", "0.0.0.0:1", "--tokens-file", str(tokens))
    _load("--listen", "0.0.0.0:1", "--allow-insecure-public-listen", "true")
    _load(
        "--listen",
        "0.0.0.0:1",
        env={"SANDBOXD_ALLOW_INSECURE_PUBLIC_LISTEN": "yes", "SANDBOXD_TOKENS_FILE": ""},
    )
    with pytest.raises(ConfigError, match="is not a boolean"):
        _load("--allow-insecure-public-listen", "maybe")


def test_toml_settings(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens", {"t": "alpha"})
    conf = tmp_path / "c.toml"
    conf.write_text(
        f'tokens_file = "{tokens}"\nallow_insecure_public_listen = true\n'
        'tenant_max_memory_bytes = "1GiB"\ntenant_max_sessions = 3\n'
    )
    config = load_config(["--helper", str(HELPER), "--config", str(conf)], env={})
    assert config.tenancy.tokens_file == tokens and config.tenancy.allow_insecure_public_listen
    assert config.tenancy.max_memory_bytes == 1024**3 and config.tenancy.max_sessions == 3


def test_bad_quota_and_tokens_settings() -> None:
    with pytest.raises(ConfigError, match="tenant_max_sessions: must not be negative"):
        _load("--tenant-max-sessions", "-1")
    with pytest.raises(ConfigError, match="tokens_file"):
        _load("--tokens-file", "/nonexistent/tokens")


def test_server_refuses_to_start_on_public_address(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandboxd",
            "--listen",
            "0.0.0.0:0",
            "--data-dir",
            str(tmp_path),
            "--helper",
            str(HELPER),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "refusing to serve a non-loopback address without authentication" in proc.stderr
    assert "allow_insecure_public_listen" in proc.stderr


def test_insecure_override_is_logged_loudly(caplog: pytest.LogCaptureFixture) -> None:
    from sandboxd.server.transport import _interceptors

    config = load_config(
        ["--helper", str(HELPER), "--listen", "0.0.0.0:1", "--allow-insecure-public-listen", "1"],
        env={},
    )
    from sandboxd.api.auth import AuthInterceptor, LocalTenantInterceptor

    with caplog.at_level("WARNING", logger="sandboxd.server"):
        interceptors = _interceptors(config, None)
    # no authentication: only the local tenant's grants are set on each call
    assert [type(i) for i in interceptors] == [LocalTenantInterceptor]
    assert not any(isinstance(i, AuthInterceptor) for i in interceptors)
    assert any(
        r.levelname == "WARNING" and "INSECURE" in r.getMessage() and "0.0.0.0:1" in r.getMessage()
        for r in caplog.records
    )


def test_tokens_without_tls_on_a_public_address_warn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from sandboxd.api.auth import AuthInterceptor
    from sandboxd.server.transport import _interceptors

    tokens = write_tokens(tmp_path / "tokens", {"t": "alpha"})
    config = load_config(
        ["--helper", str(HELPER), "--listen", "0.0.0.0:1", "--tokens-file", str(tokens)], env={}
    )
    from sandboxd.token_file import TokenFile

    with caplog.at_level("INFO", logger="sandboxd.server"):
        chain = _interceptors(config, TokenFile(tokens))
    assert len(chain) == 1 and isinstance(chain[0], AuthInterceptor)
    assert any("travel in plaintext" in r.getMessage() for r in caplog.records)
