"""One session's secret injection: its CA, its live bindings, and where values come from.

Owned by the session's egress proxy; `update` swaps the bindings whole (rotation): the next
request reads the new ones, a request already sent keeps what it was sent with.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Sequence

from sandboxd.helper_client import HelperClient, Where
from sandboxd.models import SecretBinding
from sandboxd.secrets.inject import bound, misdirected
from sandboxd.secrets.mitm import HttpRelay, Record, Refusal, Secrets, Send, secure_upstream
from sandboxd.secrets.vault import Vault
from sandboxd.trust import IMAGE_ROOTS, MAX_ROOTS_BYTES, TRUST_DIR

UPSTREAM_TLS_TIMEOUT_S = 10.0


class Interceptor:
    def __init__(
        self,
        session_id: str,
        tenant: str,
        bindings: Sequence[SecretBinding],
        refuse_misdirected: bool,
        vault: Vault,
        upstream: ssl.SSLContext,
    ) -> None:
        from sandboxd.secrets.ca import SessionCA  # cryptography: only once a secret is bound

        self.ca = SessionCA(session_id)
        self.upstream = upstream
        self._tenant = tenant
        self._vault = vault
        self._view = Secrets(tuple(bindings), refuse_misdirected, self._value_of)

    def update(self, bindings: Sequence[SecretBinding], refuse_misdirected: bool) -> None:
        self._view = Secrets(tuple(bindings), refuse_misdirected, self._value_of)

    def view(self) -> Secrets:
        return self._view

    def binds(self, host: str) -> bool:
        return bound(host, self._view.bindings)

    def check_plain(self, host: str, head: bytes, record: Record) -> None:
        """Record each placeholder in a plain request; Refusal under refuse_misdirected."""
        view = self._view
        names = misdirected(head, view.bindings)
        for name in names:
            record("secret_misdirected", "", name)
        if names and view.refuse_misdirected:
            raise Refusal("SECRET_MISDIRECTED", f"a secret's placeholder is not for {host}", 403)

    async def relay(
        self,
        host: str,
        upstream: asyncio.StreamWriter,
        record: Record,
        send: Send,
        idle_timeout_s: float,
    ) -> HttpRelay | None:
        """For a bound host: its upstream TLS up (Refusal if it does not verify) and
        the relay that will terminate the sandbox's side; None: a plain tunnel."""
        if not self.binds(host):
            return None
        await secure_upstream(upstream, host, self.upstream, UPSTREAM_TLS_TIMEOUT_S)
        return HttpRelay(host, self.view, record, send, idle_timeout_s)

    async def install_trust(self, helper: HelperClient, container_id: str) -> None:
        await install(helper, container_id, self.ca.pem)

    def _value_of(self, b: SecretBinding) -> bytes:
        """The value now (SecretUnavailable when it cannot be had); never kept."""
        if b.secret_ref:
            return self._vault.file.get(self._tenant, b.secret_ref)
        return self._vault.sealer.open(b.sealed, b.name)


async def install(helper: HelperClient, container_id: str, ca_pem: bytes) -> None:
    """Write the session CA and the bundle into the sandbox's trust tmpfs (as root)."""
    root = Where(container_id, "0:0")
    roots = b""
    for path in IMAGE_ROOTS:
        result = await helper.run(
            root,
            ["--root", "/", "read", path, str(MAX_ROOTS_BYTES)],
            max_stdout=MAX_ROOTS_BYTES + 4096,
        )
        if result.exit_code == 0:
            header, _, content = result.stdout.partition(b"\n")
            if json.loads(header).get("size") == len(content):
                roots = content
                break
    bundle = roots.rstrip(b"\n") + b"\n" + ca_pem if roots else ca_pem
    for name, data in (("session-ca.crt", ca_pem), ("ca-bundle.crt", bundle)):
        await helper.checked(
            root,
            ["--root", TRUST_DIR, "write", name, "644", str(len(data))],
            f"{TRUST_DIR}/{name}",
            stdin=data,
        )
