"""The Python client and sandboxctl with a bearer token, in plaintext and over TLS."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from authutil import Pki, write_tokens
from conftest import ServerProcess, remove_owned_containers, start_server
from sandboxd_client import TLS, Exited, SandboxClient, errors

TOKEN = "client-" + secrets.token_urlsafe(24)
SANDBOXCTL = Path(sys.executable).parent / "sandboxctl"


def _server(tmp: Path, *flags: str) -> ServerProcess:
    tokens = write_tokens(tmp / "tokens", {TOKEN: "alpha"})
    owner = "clientauth" + secrets.token_hex(4)
    return start_server(tmp / "data", owner, "--tokens-file", str(tokens), *flags)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"), "client")


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = _server(tmp_path_factory.mktemp("token"))
    yield srv
    srv.stop()
    remove_owned_containers(srv.owner_id)


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


async def _exec_round_trip(client: SandboxClient) -> None:
    """A unary call, a server stream and a client stream all carry the token."""
    async with await client.create_session(allow=["sh"]) as session:
        events = [e async for e in session.exec(["sh", "-c", "exit 4"])]
        assert isinstance(events[-1], Exited) and events[-1].exit_code == 4

        async def empty_tar() -> AsyncIterator[bytes]:
            yield b"\0" * 1024

        await session.import_archive(empty_tar(), "")
        # a bidirectional stream (written to after it started) carries it too
        async with session.interact(["sh"]) as proc:
            await proc.send(b"exit 6\n")
            last = [e async for e in proc][-1]
        assert isinstance(last, Exited) and last.exit_code == 6


async def test_token_over_plaintext(token_server: ServerProcess) -> None:
    async with SandboxClient(token_server.address, token=TOKEN, timeout=60) as client:
        await _exec_round_trip(client)
    async with SandboxClient(token_server.address, timeout=60) as anonymous:
        with pytest.raises(errors.Unauthenticated) as exc:
            await anonymous.server_info()
    assert exc.value.reason == "TOKEN_MISSING"
    started = time.monotonic()
    async with SandboxClient(token_server.address, token="wrong", timeout=5) as wrong:
        with pytest.raises(errors.Unauthenticated) as bad:
            _ = [s async for s in wrong.list_sessions()]
    # refused at the first-use check, typed, not retried, well inside the deadline
    assert bad.value.reason == "TOKEN_INVALID" and not bad.value.retryable
    assert time.monotonic() - started < 5


async def test_token_over_tls(tls_server: ServerProcess, pki: Pki) -> None:
    tls = TLS(root_certificates=pki.ca_pem)
    async with SandboxClient(tls_server.address, token=TOKEN, tls=tls, timeout=60) as client:
        await _exec_round_trip(client)


def test_sandboxctl_with_token_and_ca(tls_server: ServerProcess, pki: Pki) -> None:
    env = {**os.environ, "SANDBOXD_ADDR": tls_server.address, "SANDBOXD_TOKEN": TOKEN}
    ca = ["--ca", str(pki.ca_path)]

    def ctl(*args: str, **kw: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [str(SANDBOXCTL), *args], capture_output=True, env={**env, **kw}, timeout=120
        )

    sid = ctl(*ca, "create", "--allow", "echo").stdout.decode().strip()
    assert sid
    try:
        ran = ctl(*ca, "exec", sid, "--", "echo", "over tls")
        assert (ran.returncode, ran.stdout) == (0, b"over tls\n")
        anonymous = ctl(*ca, "ls", SANDBOXD_TOKEN="")
        assert anonymous.returncode == 125
        assert anonymous.stderr.startswith(b"sandboxctl: TOKEN_MISSING: ")
    finally:
        assert ctl(*ca, "rm", sid).returncode == 0
