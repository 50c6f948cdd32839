"""envd access tokens: what lets an E2B client reach one sandbox's envd without its API key.

E2B's SDK sends its API key to the REST control plane only; envd calls carry the sandbox id
and the per-sandbox `X-Access-Token` it got at create or connect. sandboxd has one credential,
the tenant's bearer token, so the access token is that key sealed (AES-GCM, a key of this
server's kept in its data directory) together with the sandbox id it was issued for. Opening
it gives back the bearer token, which every call then presents to the gRPC server as any client
would: a token never widens what its key may do, a token for one sandbox opens no other, a
key removed from the tokens file stops its tokens too, and nothing is kept per token.

`cryptography` (its Rust extension: some 9 MiB of RSS) is loaded by the first token issued or
opened, not when the door starts: a server whose door nobody has called stays small.
"""

from __future__ import annotations

import binascii
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd import base64url
from sandboxd.e2b.connect import ConnectError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_FILE = "e2b-token-key"
NONCE_BYTES = 12
MAX_TOKEN_CHARS = 4096


def load_key(data_dir: Path) -> bytes:
    """This server's sealing key, made once (0600) and kept, so tokens outlive a restart."""
    path = data_dir / KEY_FILE
    try:
        key = path.read_bytes()
        if len(key) == 32:
            return key
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(32)
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    tmp.replace(path)
    return key


class AccessTokens:
    def __init__(self, key: bytes) -> None:
        self._key = key
        self._sealer: AESGCM | None = None

    def _aead(self) -> AESGCM:
        """The AES-GCM of this server's key, made (and `cryptography` loaded) on first use."""
        if self._sealer is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            self._sealer = AESGCM(self._key)
        return self._sealer

    def issue(self, sandbox_id: str, api_key: str) -> str:
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = self._aead().encrypt(nonce, api_key.encode(), sandbox_id.encode())
        return base64url.encode(nonce + sealed)

    def open(self, sandbox_id: str, token: str | None) -> str:
        """The API key `token` was issued with, for `sandbox_id` only; else UNAUTHENTICATED."""
        if not token:
            raise ConnectError("unauthenticated", "missing X-Access-Token")
        if len(token) > MAX_TOKEN_CHARS:
            raise ConnectError("unauthenticated", "invalid access token")
        aead = self._aead()
        from cryptography.exceptions import InvalidTag  # loaded with the AEAD just above

        try:
            raw = base64url.decode(token)
            plain = aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], sandbox_id.encode())
            return plain.decode()
        except (binascii.Error, ValueError, InvalidTag, UnicodeDecodeError):
            raise ConnectError("unauthenticated", "invalid access token for this sandbox") from None
