"""A session's own certificate authority: leaf certificates issued on the fly, in memory.

The CA key is drawn per proxy (per session and server run) and never leaves this object; its
certificate is what the sandbox trusts. Leaf keys and certificates reach OpenSSL through an
anonymous memory file (memfd), never a path on disk. Imported when a session first binds a
secret (`interceptor.py`): `cryptography` costs a server that never needs it some 12 MiB.
"""

from __future__ import annotations

import datetime
import os
import ssl
from collections import OrderedDict

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

MAX_CONTEXTS = 256
CA_LIFETIME = datetime.timedelta(days=3650)
LEAF_LIFETIME = datetime.timedelta(days=7)
SKEW = datetime.timedelta(hours=1)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class SessionCA:
    def __init__(self, session_id: str) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sandboxd"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"sandboxd session {session_id[:40]} CA"),
            ]
        )
        self._name = name
        public = self._key.public_key()
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - SKEW)
            .not_valid_after(_now() + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.pem = self.certificate.public_bytes(serialization.Encoding.PEM)
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()

    def context(self, host: str) -> ssl.SSLContext:
        """A server-side TLS context presenting a certificate for `host` (cached, bounded)."""
        ctx = self._contexts.get(host)
        if ctx is not None:
            self._contexts.move_to_end(host)
            return ctx
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        key, chain = self._issue(host)
        fd = os.memfd_create("sandboxd-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, key + chain)
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        self._contexts[host] = ctx
        if len(self._contexts) > MAX_CONTEXTS:
            self._contexts.popitem(last=False)
        return ctx

    def _issue(self, host: str) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - SKEW)
            .not_valid_after(_now() + LEAF_LIFETIME)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return key_pem, cert.public_bytes(serialization.Encoding.PEM)
