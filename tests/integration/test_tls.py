"""TLS and mutual TLS on the gRPC port, with certificates each run generates (loopback only)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from authutil import Pki, authed_stubs, write_tokens
from conftest import HELPER, ServerProcess, expect_error, remove_owned_containers, start_server
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sandboxd.config import load_config
from sandboxd.errors import ConfigError
from sandboxd.v1 import session_pb2

TOKEN = "tls-" + secrets.token_urlsafe(24)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"), "good")


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki-other"), "other")


def _server(tmp: Path, *flags: str) -> ServerProcess:
    tokens = write_tokens(tmp / "tokens", {TOKEN: "alpha"})
    return start_server(
        tmp / "data", "tls" + secrets.token_hex(4), "--tokens-file", str(tokens), *flags
    )


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    srv = _server(
        tmp_path_factory.mktemp("tls"),
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
    )
    yield srv
    srv.stop()
    remove_owned_containers(srv.owner_id)


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    srv = _server(
        tmp_path_factory.mktemp("mtls"),
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        "--tls-client-ca",
        str(pki.ca_path),
    )
    yield srv
    srv.stop()
    remove_owned_containers(srv.owner_id)


def _list(address: str, creds: grpc.ChannelCredentials | None, token: str | None = TOKEN) -> None:
    stubs = authed_stubs(address, token, credentials=creds)
    try:
        stubs.sessions.ListSessions(session_pb2.ListSessionsRequest(), timeout=10)
    finally:
        stubs.channel.close()


def _unavailable(address: str, creds: grpc.ChannelCredentials | None) -> None:
    with pytest.raises(grpc.RpcError) as excinfo:
        _list(address, creds)
    assert excinfo.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


def test_tls_serves_clients_that_trust_the_ca(tls_server: ServerProcess, pki: Pki) -> None:
    _list(tls_server.address, grpc.ssl_channel_credentials(pki.ca_pem))
    channel = grpc.secure_channel(tls_server.address, grpc.ssl_channel_credentials(pki.ca_pem))
    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    channel.close()
    assert "TLS on (server certificate only)" in tls_server.log()


def test_tls_still_needs_the_token(tls_server: ServerProcess, pki: Pki) -> None:
    stubs = authed_stubs(
        tls_server.address, None, credentials=grpc.ssl_channel_credentials(pki.ca_pem)
    )
    expect_error(
        lambda: stubs.sessions.ListSessions(session_pb2.ListSessionsRequest()),
        grpc.StatusCode.UNAUTHENTICATED,
        "TOKEN_MISSING",
    )
    stubs.channel.close()


def test_tls_refuses_plaintext_and_untrusted_clients(
    tls_server: ServerProcess, other_pki: Pki
) -> None:
    _unavailable(tls_server.address, None)  # plaintext against a TLS port
    _unavailable(tls_server.address, grpc.ssl_channel_credentials(other_pki.ca_pem))


def test_mtls_accepts_a_client_certificate_from_the_ca(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    key, cert = pki.client("agent-1")
    creds = grpc.ssl_channel_credentials(pki.ca_pem, private_key=key, certificate_chain=cert)
    _list(mtls_server.address, creds)
    assert "client certificates required" in mtls_server.log()


def test_mtls_refuses_clients_without_a_good_certificate(
    mtls_server: ServerProcess, pki: Pki, other_pki: Pki
) -> None:
    _unavailable(mtls_server.address, grpc.ssl_channel_credentials(pki.ca_pem))  # no cert
    key, cert = other_pki.client("intruder")  # signed by a CA the server does not trust
    _unavailable(
        mtls_server.address,
        grpc.ssl_channel_credentials(pki.ca_pem, private_key=key, certificate_chain=cert),
    )
    _unavailable(mtls_server.address, None)


def test_server_stays_healthy_after_refused_handshakes(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    for _ in range(5):
        _unavailable(mtls_server.address, grpc.ssl_channel_credentials(pki.ca_pem))
    key, cert = pki.client()
    _list(
        mtls_server.address,
        grpc.ssl_channel_credentials(pki.ca_pem, private_key=key, certificate_chain=cert),
    )
    assert mtls_server.proc.poll() is None


def _load(*argv: str) -> object:
    return load_config(["--helper", str(HELPER), *argv], env={})


def test_tls_settings_are_validated(tmp_path: Path, pki: Pki) -> None:
    cert, key, ca = str(pki.server_cert), str(pki.server_key), str(pki.ca_path)
    with pytest.raises(ConfigError, match="set both"):
        _load("--tls-cert", cert)
    with pytest.raises(ConfigError, match="set both"):
        _load("--tls-key", key)
    with pytest.raises(ConfigError, match="client certificates need TLS"):
        _load("--tls-client-ca", ca)
    with pytest.raises(ConfigError, match="tls_cert .* missing or not readable"):
        _load("--tls-cert", str(tmp_path / "nope.crt"), "--tls-key", key)
    _load("--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca)
