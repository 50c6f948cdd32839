"""How a unit test hands connections to an in-process EgressProxy (which has no listener).

`LoopbackFront`: a listener of the test's own on 127.0.0.1 gives each accepted socket to
`proxy.accept` (the proxy's mechanics alone). `AgentFront`: the real path without Docker: the
helper's `sbx agent` (its static and its ASan/UBSan build, tests/agent_pipes.py) runs as a child
process over pipes, the server's `Channel` talks to it and routes its `egress` streams
(sandboxd.agent.egress_route) to the proxy, and the test connects to the agent's listener on
127.0.0.1:<free port> like a sandbox process would.

A test runs over every front in `FRONTS` by taking `front_helper(request)` (None for the
loopback one) and serving its proxy with `front(helper, proxy, tmp)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_pipes import Builds, Helper, PipeTransport, agent_process
from sandboxd.agent.channel import Channel
from sandboxd.agent.egress_route import EgressAcceptor, peer_open_handler
from sandboxd.egress.proxy import EgressProxy

SESSION = "s-test"
FRONTS = ("loopback", "agent", "agent-asan")


def front_helper(request: pytest.FixtureRequest) -> Helper | None:
    """The helper build a test parametrized over `FRONTS` connects through (session fixture
    `helper_builds`); None for the loopback front."""
    if request.param == "loopback":
        return None
    builds: Builds = request.getfixturevalue("helper_builds")
    return builds.get("asan" if request.param == "agent-asan" else "static")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class OneSession:
    """EgressEndpoints with one session's proxy (or none: every stream refused)."""

    def __init__(self, proxy: EgressAcceptor | None, port: int) -> None:
        self.proxy = proxy
        self.port = port

    def egress_port(self, session_id: str) -> int:
        return self.port if session_id == SESSION else 0

    def acceptor(self, session_id: str) -> EgressAcceptor | None:
        return self.proxy if session_id == SESSION else None


@contextlib.asynccontextmanager
async def loopback_front(proxy: EgressProxy) -> AsyncIterator[tuple[str, int]]:
    server = await asyncio.start_server(
        proxy.accept, "127.0.0.1", 0, limit=proxy.read_limit, reuse_address=True
    )
    try:
        yield "127.0.0.1", int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


@contextlib.asynccontextmanager
async def agent_front(
    helper: Helper,
    proxy: EgressAcceptor | None,
    tmp: Path,
    *,
    session_id: str = SESSION,
    window: int = 262144,
) -> AsyncIterator[tuple[str, int]]:
    """The agent's egress listener, its streams served by `proxy` through a real Channel."""
    port = free_port()
    endpoints = OneSession(proxy, port)
    async with agent_process(helper, tmp) as proc:
        channel = Channel(
            PipeTransport(proc, close_stdin=True),
            name="egress-test",
            window=window,
            handshake_s=5.0,
            resend_s=0.2,
            egress_port=endpoints.egress_port(session_id),
            on_peer_open=peer_open_handler(endpoints, session_id),
        )
        try:
            hello = await channel.start()
            assert hello.pid > 0
            yield "127.0.0.1", port
        finally:
            await channel.close()


@contextlib.asynccontextmanager
async def front(
    helper: Helper | None, proxy: EgressProxy, tmp: Path
) -> AsyncIterator[tuple[str, int]]:
    """Connections to `proxy` through the agent `helper` runs, or a loopback listener (None)."""
    if helper is not None:
        async with agent_front(helper, proxy, tmp) as address:
            yield address
    else:
        async with loopback_front(proxy) as address:
            yield address
