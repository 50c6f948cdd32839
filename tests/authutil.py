"""Test helpers for authenticated servers: tokens files, token-carrying stubs, certificates."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import Stubs
from sandboxd.v1 import (
    admin_pb2_grpc,
    filesystem_pb2_grpc,
    process_pb2_grpc,
    session_pb2_grpc,
)

_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def write_tokens(path: Path, tokens: dict[str, str], options: dict[str, str] | None = None) -> Path:
    """A tokens file mapping each token to its tenant (token -> tenant); `options` adds the
    tenant's grants to its lines (tenant -> 'admin egress_private_networks=allow ...')."""
    options = options or {}
    lines = ["# tenant sha256(token) [option...]"]
    lines += [
        f"{tenant} {hashlib.sha256(tok.encode()).hexdigest()} {options.get(tenant, '')}".rstrip()
        for tok, tenant in tokens.items()
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


class _Details(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, base: Any, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class BearerAuth(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds `authorization: <value>` (any text, so tests can send malformed headers)."""

    def __init__(self, value: str) -> None:
        self._value = value

    def _details(self, details: Any) -> _Details:
        metadata = list(details.metadata or []) + [("authorization", self._value)]
        return _Details(details, metadata)

    def intercept_unary_unary(self, cont: Callable[..., Any], details: Any, req: Any) -> Any:
        return cont(self._details(details), req)

    def intercept_unary_stream(self, cont: Callable[..., Any], details: Any, req: Any) -> Any:
        return cont(self._details(details), req)

    def intercept_stream_unary(
        self, cont: Callable[..., Any], details: Any, it: Iterator[Any]
    ) -> Any:
        return cont(self._details(details), it)

    def intercept_stream_stream(
        self, cont: Callable[..., Any], details: Any, it: Iterator[Any]
    ) -> Any:
        return cont(self._details(details), it)


def stubs_for(channel: grpc.Channel) -> Stubs:
    return Stubs(
        channel,
        session_pb2_grpc.SessionServiceStub(channel),
        process_pb2_grpc.ProcessServiceStub(channel),
        filesystem_pb2_grpc.FilesystemServiceStub(channel),
        admin_pb2_grpc.AdminServiceStub(channel),
    )


def tenant_fixture(server_fixture: str, token: str) -> Any:
    """A module fixture: stubs of the tenant holding `token` on the server of `server_fixture`."""

    @pytest.fixture(scope="module")
    def stubs(request: pytest.FixtureRequest) -> Iterator[Stubs]:
        server = request.getfixturevalue(server_fixture)
        s = authed_stubs(server.address, token)
        yield s
        s.channel.close()

    return stubs


def authed_stubs(
    address: str,
    token: str | None,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    header: str | None = None,
    override_host: str | None = None,
) -> Stubs:
    """Stubs whose every call carries `Bearer <token>` (or the raw `header` value)."""
    options = list(_OPTIONS)
    if override_host:
        options.append(("grpc.ssl_target_name_override", override_host))
    if credentials is None:
        channel = grpc.insecure_channel(address, options=options)
    else:
        channel = grpc.secure_channel(address, credentials, options=options)
    value = header if header is not None else (f"Bearer {token}" if token else None)
    if value is not None:
        channel = grpc.intercept_channel(channel, BearerAuth(value))
    return stubs_for(channel)


# --------------------------------------------------------------------------------------------
# Certificates (generated per test run; never checked in)
# --------------------------------------------------------------------------------------------


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(  # type: ignore[no-any-return]
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert(
    subject_cn: str,
    key: Any,
    issuer_cn: str,
    issuer_key: Any,
    *,
    ca: bool,
    server: bool = False,
    ips: tuple[str, ...] = ("127.0.0.1",),
) -> Any:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_cn)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost")]
                + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


class Pki:
    """A throw-away CA with a server certificate and client certificates, as PEM files."""

    def __init__(self, directory: Path, name: str = "ca") -> None:
        from cryptography.hazmat.primitives import serialization

        self._pem = serialization.Encoding.PEM
        self.dir = directory
        self.name = name
        self.ca_key = _key()
        self.ca_cert = _cert(
            f"{name} test CA", self.ca_key, f"{name} test CA", self.ca_key, ca=True
        )
        self.ca_pem = self.ca_cert.public_bytes(self._pem)
        self.ca_path = self._write(f"{name}.crt", self.ca_pem)
        key = _key()
        cert = _cert("localhost", key, f"{name} test CA", self.ca_key, ca=False, server=True)
        self.server_cert = self._write(f"{name}-server.crt", cert.public_bytes(self._pem))
        self.server_key = self._write(f"{name}-server.key", _pem_key(key))

    def _write(self, filename: str, data: bytes) -> Path:
        path = self.dir / filename
        path.write_bytes(data)
        return path

    def server_for(self, ip: str) -> tuple[Path, Path]:
        """(certificate, key) files of a server certificate for the address `ip`."""
        key = _key()
        cert = _cert(ip, key, f"{self.name} test CA", self.ca_key, ca=False, server=True, ips=(ip,))
        return (
            self._write(f"{self.name}-{ip}.crt", cert.public_bytes(self._pem)),
            self._write(f"{self.name}-{ip}.key", _pem_key(key)),
        )

    def client_files(self, cn: str = "client") -> tuple[Path, Path]:
        """(certificate, key) files of a client certificate this CA signed."""
        key, cert = self.client(cn)
        return self._write(f"{cn}.crt", cert), self._write(f"{cn}.key", key)

    def client(self, cn: str = "client") -> tuple[bytes, bytes]:
        """(key PEM, certificate PEM) of a client certificate this CA signed."""
        key = _key()
        cert = _cert(cn, key, f"{self.name} test CA", self.ca_key, ca=False)
        return _pem_key(key), cert.public_bytes(self._pem)
