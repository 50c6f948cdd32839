"""Token rotation without a restart: SIGHUP reads the tokens file again, keeps the old table when
the new file does not parse, says what changed by tenant (never a token), and a server without
a tokens file is not ended by SIGHUP (the signal's default action)."""

from __future__ import annotations

import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from authutil import authed_stubs, write_tokens
from conftest import (
    ServerProcess,
    expect_error,
    remove_owned_containers,
    start_server,
    wait_until,
)
from sandboxd.v1 import session_pb2

OLD_A = "alpha-" + secrets.token_urlsafe(24)
NEW_A = "alpha2-" + secrets.token_urlsafe(24)
TOKEN_B = "beta-" + secrets.token_urlsafe(24)
TOKEN_C = "gamma-" + secrets.token_urlsafe(24)
U = grpc.StatusCode.UNAUTHENTICATED


@pytest.fixture
def rotating(tmp_path: Path) -> Iterator[tuple[ServerProcess, Path]]:
    tokens = write_tokens(tmp_path / "tokens", {OLD_A: "alpha", TOKEN_B: "beta"})
    owner = "rot" + secrets.token_hex(4)
    srv = start_server(tmp_path / "data", owner, "--tokens-file", str(tokens))
    yield srv, tokens
    srv.stop()
    remove_owned_containers(owner)


def _list(server: ServerProcess, token: str) -> object:
    stubs = authed_stubs(server.address, token)
    try:
        return stubs.sessions.ListSessions(session_pb2.ListSessionsRequest(), timeout=10)
    finally:
        stubs.channel.close()


def _reloads(server: ServerProcess, count: int) -> None:
    server.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: server.log().count("tokens file") >= count, timeout=15)


def test_sighup_rotates_tokens_and_says_what_changed(rotating: tuple[ServerProcess, Path]) -> None:
    server, tokens = rotating
    _list(server, OLD_A)
    write_tokens(tokens, {NEW_A: "alpha", TOKEN_C: "gamma"}, {"gamma": "admin"})
    _reloads(server, 1)
    expect_error(lambda: _list(server, OLD_A), U, "TOKEN_INVALID")
    expect_error(lambda: _list(server, TOKEN_B), U, "TOKEN_INVALID")
    _list(server, NEW_A)
    _list(server, TOKEN_C)
    log = server.log()
    assert "tenants added: gamma" in log and "tenants removed: beta" in log
    assert "tokens changed: alpha" in log
    for token in (OLD_A, NEW_A, TOKEN_B, TOKEN_C):
        assert token not in log
    assert server.proc.poll() is None


def test_a_file_that_does_not_parse_keeps_the_tokens_in_use(
    rotating: tuple[ServerProcess, Path],
) -> None:
    server, tokens = rotating
    tokens.write_text("alpha not-a-digest\n")
    _reloads(server, 1)
    assert "not reloaded, the tokens in use are kept" in server.log()
    _list(server, OLD_A)
    _list(server, TOKEN_B)


def test_sighup_without_a_tokens_file_does_not_end_the_server(server: ServerProcess) -> None:
    server.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "nothing to reload" in server.log(), timeout=15)
    assert server.proc.poll() is None
