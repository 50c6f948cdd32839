"""Preview access tokens: signed, expiring, bound to one published port of one session.

A token is `<payload>.<mac>`, both URL-safe base64: the payload names the session, the port,
the tenant, the port's publication generation and the expiry; the MAC is HMAC-SHA256 under
the server's preview key. The key lives in the data directory (`preview-key`, mode 0600), so
tokens survive a server restart as the published ports do. Revocation is by generation: every
PublishPort of a port bumps it and UnpublishPort removes the port, so an older token no longer
matches the registry (`previews.registry`) even before it expires.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from sandboxd import base64url

KEY_FILE = "preview-key"
_MAC_BYTES = 20
MAX_TOKEN_CHARS = 1024


@dataclass(frozen=True)
class Claims:
    session_id: str
    port: int
    tenant: str
    generation: int
    expires_at: float


def load_key(data_dir: Path) -> bytes:
    """The server's preview key, made once (0600) and kept in the data directory."""
    path = data_dir / KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        tmp.replace(path)
    return bytes.fromhex(path.read_text().strip())


class TokenSigner:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, b"preview\0" + payload, hashlib.sha256).digest()[:_MAC_BYTES]

    def sign(self, claims: Claims) -> str:
        doc = [claims.session_id, claims.port, claims.tenant, claims.generation]
        payload = json.dumps([*doc, int(claims.expires_at)], separators=(",", ":")).encode()
        return f"{base64url.encode(payload)}.{base64url.encode(self._mac(payload))}"

    def verify(self, token: str) -> Claims | None:
        """The token's claims if this server signed it (expiry not checked here); else None."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        body, dot, mac = token.partition(".")
        try:
            payload = base64url.decode(body)
            if not dot or not hmac.compare_digest(base64url.decode(mac), self._mac(payload)):
                return None
            session_id, port, tenant, generation, expires = json.loads(payload)
        except (ValueError, TypeError, UnicodeDecodeError):
            return None
        if not (
            isinstance(session_id, str)
            and isinstance(tenant, str)
            and all(isinstance(n, int) for n in (port, generation, expires))
        ):
            return None
        return Claims(session_id, port, tenant, generation, float(expires))
