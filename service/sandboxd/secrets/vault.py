"""Where secret values live on the server: sealed bytes, the operator's secrets file.

Inline values are sealed with AES-GCM under a key that is never in the data directory: the
setting `secrets_key_file` (32 random bytes, hex or raw) or, without it, a key drawn at start
and kept in memory only. With the in-memory key, a restart makes the sealed values of live
sessions unreadable: their placeholders are then never replaced (requests to the bound hosts
are refused, SECRET_UNAVAILABLE in the egress audit) until UpdateNetworkPolicy sets the values
again. References into the secrets file survive restarts: the file is read when a value is used.

Secrets file (setting `secrets_file`): one secret a line, `tenant/name value`; the value is the
rest of the line (leading/trailing blanks stripped); blank lines and lines starting with `#`
are ignored. A tenant's sessions can only reference its own names.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.errors import ConfigError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
_NONCE = 12
MAX_FILE_BYTES = 4 * 1024 * 1024
RECHECK_S = 1.0


class SecretUnavailable(Exception):
    """A value that cannot be read now (key changed by a restart, reference removed)."""


class Sealer:
    """Seals values with one key; the key never leaves this object.

    The cipher is built at the first use: `cryptography` adds some 12 MiB to the RSS of a
    server whose sessions never hold a secret (its idle target is 80 MiB).
    """

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(KEY_BYTES)
        self._cipher: AESGCM | None = None

    def _aead(self) -> AESGCM:
        if self._cipher is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            self._cipher = AESGCM(self._key)
        return self._cipher

    @classmethod
    def from_file(cls, path: Path) -> Sealer:
        try:
            raw = path.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"secrets_key_file {path}: {exc}") from None
        try:
            key = bytes.fromhex(raw.decode("ascii")) if len(raw) == 2 * KEY_BYTES else raw
        except (UnicodeDecodeError, ValueError):
            key = raw
        if len(key) != KEY_BYTES:
            raise ConfigError(
                f"secrets_key_file {path} must hold {KEY_BYTES} random bytes (raw or hex)"
            )
        return cls(key)

    def seal(self, value: bytes, context: str) -> bytes:
        nonce = os.urandom(_NONCE)
        return nonce + self._aead().encrypt(nonce, value, context.encode())

    def open(self, sealed: bytes, context: str) -> bytes:
        from cryptography.exceptions import InvalidTag

        aead = self._aead()
        try:
            return aead.decrypt(sealed[:_NONCE], sealed[_NONCE:], context.encode())
        except (InvalidTag, ValueError):
            raise SecretUnavailable("sealed under another key (a server restart?)") from None


class SecretsFile:
    """The operator's `tenant/name value` file, re-read when it changes."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._checked = -RECHECK_S
        self._values: dict[tuple[str, str], bytes] = {}

    def _load(self) -> dict[tuple[str, str], bytes]:
        """Looked at (one stat) at most every RECHECK_S, so a busy proxy does not touch the
        disk per request; an edit is picked up within that time."""
        if self._path is None:
            return {}
        with self._lock:
            if time.monotonic() - self._checked < RECHECK_S:
                return self._values
            self._checked = time.monotonic()
            try:
                st = self._path.stat()
            except OSError:
                return {}
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                self._values = parse(self._path.read_bytes()[:MAX_FILE_BYTES])
                self._stamp = stamp
            return self._values

    def has(self, tenant: str, name: str) -> bool:
        return (tenant, name) in self._load()

    def get(self, tenant: str, name: str) -> bytes:
        try:
            return self._load()[(tenant, name)]
        except KeyError:
            raise SecretUnavailable(f"secret_ref {name!r} is not in the secrets file") from None


def parse(data: bytes) -> dict[tuple[str, str], bytes]:
    """Malformed lines are skipped (never echoed: they may hold a value)."""
    values: dict[tuple[str, str], bytes] = {}
    for line in data.splitlines():
        line = line.strip()
        if not line or line.startswith(b"#"):
            continue
        key, _, value = line.partition(b" ")
        tenant, slash, name = key.decode("utf-8", "replace").partition("/")
        value = value.strip()
        if slash and tenant and name and value and b"\0" not in value:
            values[(tenant, name)] = value
    return values


class Vault:
    """The server's sealer and secrets file (one per server, configured at start)."""

    def __init__(self, sealer: Sealer | None = None, secrets_file: SecretsFile | None = None):
        self.sealer = sealer or Sealer()
        self.file = secrets_file or SecretsFile(None)


_vault = Vault()


def vault() -> Vault:
    return _vault


def configure(key_file: str, secrets_file: str) -> Vault:
    """Called once by the server before it serves."""
    global _vault
    _vault = Vault(
        Sealer.from_file(Path(key_file)) if key_file else Sealer(),
        SecretsFile(Path(secrets_file) if secrets_file else None),
    )
    return _vault


def placeholder() -> str:
    """A random token unique to a session's secret; it never reveals the value."""
    return "sbx_secret_" + secrets.token_hex(20)
