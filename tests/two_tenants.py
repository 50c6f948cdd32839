"""Two tenants on a server of their own, for the tests of what one tenant's load does to
another's: `flood` (the one that presses) and `calm` (its bystander), each with a token of its
own, and a stub set per tenant. A test module takes the pair of fixtures as its `server` and
`stubs` (`server, stubs = two_tenant_fixtures("tcpu")`), with its own server flags."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from authutil import authed_stubs, write_tokens
from conftest import ServerProcess, Stubs, remove_owned_containers, start_server

TENANTS = ("flood", "calm")


def two_tenant_fixtures(
    prefix: str, *server_args: str
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Module-scoped `server` (its owner id and data directory start with `prefix`, its flags
    are `server_args` past the tokens file) and `stubs` (tenant -> its stubs) fixtures."""
    tokens = {f"{t[0]}-{secrets.token_urlsafe(16)}": t for t in TENANTS}
    token_of = {tenant: token for token, tenant in tokens.items()}

    @pytest.fixture(scope="module", name="server")
    def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
        tmp = tmp_path_factory.mktemp(prefix)
        path = write_tokens(Path(tmp) / "tokens", tokens)
        owner = prefix + secrets.token_hex(4)
        srv = start_server(tmp / "data", owner, "--tokens-file", str(path), *server_args)
        yield srv
        srv.stop()
        remove_owned_containers(owner)

    @pytest.fixture(scope="module", name="stubs")
    def stubs(server: ServerProcess) -> Iterator[dict[str, Stubs]]:
        made = {t: authed_stubs(server.address, token_of[t]) for t in TENANTS}
        yield made
        for s in made.values():
            s.channel.close()

    return server, stubs
