"""The engine's address and TLS settings (engine_address.py): a remote engine over tcp://
with client certificates, and a clear error for every wrong setting, at start-up."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiodocker
import pytest
from authutil import Pki
from conftest import HELPER
from sandboxd.config import load_config
from sandboxd.engine.docker_errors import translate_errors
from sandboxd.engine_address import engine_address
from sandboxd.errors import ConfigError, EngineUnavailable

H = ["--helper", str(HELPER)]
REMOTE = "tcp://10.254.0.2:2376"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path, "engine")


def tls_flags(pki: Pki, *, cert: Path | None = None, key: Path | None = None) -> list[str]:
    client_cert, client_key = pki.client_files("sandboxd")
    return [
        "--docker-host",
        REMOTE,
        "--docker-tls-ca",
        str(pki.ca_path),
        "--docker-tls-cert",
        str(cert or client_cert),
        "--docker-tls-key",
        str(key or client_key),
    ]


def test_the_local_socket_by_default() -> None:
    address = engine_address("")
    assert (address.url, address.socket_path, address.tls, address.local) == (
        "unix://localhost",
        "/var/run/docker.sock",
        None,
        True,
    )
    assert engine_address("unix:///run/d.sock").socket_path == "/run/d.sock"


def test_a_remote_engine_with_client_certificates(pki: Pki) -> None:
    config = load_config([*H, *tls_flags(pki)], env={})
    assert config.engine.docker_tls_verify
    address = engine_address(
        config.engine.docker_host,
        ca=config.engine.docker_tls_ca,
        cert=config.engine.docker_tls_cert,
        key=config.engine.docker_tls_key,
    )
    assert address.url == "https://10.254.0.2:2376" and not address.local
    assert address.tls is not None
    assert address.tls.verify_mode == ssl.CERT_REQUIRED and address.tls.check_hostname


def test_verify_false_encrypts_without_checking_the_engine(pki: Pki) -> None:
    cert, key = pki.client_files()
    address = engine_address(REMOTE, ca=pki.ca_path, cert=cert, key=key, verify=False)
    assert address.tls is not None and address.tls.verify_mode == ssl.CERT_NONE


def test_an_engine_on_loopback_counts_as_local(pki: Pki) -> None:
    address = engine_address("tcp://127.0.0.1:2376", ca=pki.ca_path)
    assert address.local and address.url == "https://127.0.0.1:2376"


def test_plain_tcp_is_refused_unless_allowed() -> None:
    with pytest.raises(ConfigError, match="docker_allow_plain_tcp"):
        load_config([*H, "--docker-host", REMOTE], env={})
    config = load_config([*H, "--docker-host", REMOTE, "--docker-allow-plain-tcp", "true"], env={})
    assert config.engine.docker_allow_plain_tcp
    address = engine_address(REMOTE, allow_plain_tcp=True)
    assert address.url == "http://10.254.0.2:2376" and address.tls is None


@pytest.mark.parametrize(
    "host",
    ["tcp://10.254.0.2", "tcp://10.254.0.2:2376/v1.41", "tcp://:2376", "tcp://h:port", "ssh://h"],
)
def test_a_malformed_engine_address_is_refused(host: str) -> None:
    with pytest.raises(ConfigError, match="docker_host"):
        engine_address(host, allow_plain_tcp=True)


def test_tls_files_for_a_unix_socket_are_refused(pki: Pki) -> None:
    with pytest.raises(ConfigError, match="docker_tls_ca.*tcp://"):
        load_config([*H, "--docker-tls-ca", str(pki.ca_path)], env={})


def test_a_missing_certificate_file_names_its_setting(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="docker_tls_cert .*missing or not readable"):
        load_config([*H, *tls_flags(pki, cert=tmp_path / "absent.crt")], env={})
    with pytest.raises(ConfigError, match="docker_tls_key .*missing or not readable"):
        load_config([*H, *tls_flags(pki, key=tmp_path)], env={})  # a directory


def test_a_file_that_is_not_pem_is_refused(pki: Pki, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="docker_tls_ca .*not a PEM CA bundle"):
        engine_address(REMOTE, ca=junk)
    with pytest.raises(ConfigError, match="not a PEM certificate and its private key"):
        load_config([*H, *tls_flags(pki, cert=junk)], env={})


def test_a_key_that_does_not_match_the_certificate_is_refused(pki: Pki) -> None:
    cert, _ = pki.client_files("one")
    _, other_key = pki.client_files("two")
    with pytest.raises(ConfigError, match="docker_tls_cert"):
        engine_address(REMOTE, ca=pki.ca_path, cert=cert, key=other_key)


def test_a_certificate_needs_its_key(pki: Pki) -> None:
    cert, _ = pki.client_files()
    with pytest.raises(ConfigError, match="docker_tls_cert and docker_tls_key"):
        engine_address(REMOTE, ca=pki.ca_path, cert=cert)


# ----- what a TLS failure looks like to callers ----------------------------------------------


def _raised(exc: BaseException) -> EngineUnavailable:
    with pytest.raises(EngineUnavailable) as info, translate_errors("engine ping"):
        raise exc
    return info.value


def test_a_tls_failure_says_so_and_what_to_check() -> None:
    refused = aiodocker.DockerError(
        900,
        "Cannot connect to Docker Engine via https://10.254.0.2:2376 "
        "[[Errno 1] [SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate]",
    )
    for exc in (refused, ssl.SSLCertVerificationError(1, "certificate verify failed")):
        message = str(_raised(exc))
        assert "TLS connection to the Docker engine failed" in message, message
        assert "docker_tls_ca, docker_tls_cert and docker_tls_key" in message


def test_an_engine_that_is_down_is_not_called_a_tls_failure() -> None:
    message = str(_raised(ConnectionRefusedError(111, "Connection refused")))
    assert "does not answer" in message and "TLS" not in message
