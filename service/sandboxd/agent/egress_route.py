"""Where an `egress` stream the agent opens goes: the allowlist proxy of the session its
sandbox belongs to (docs/agent.md, "OPEN kinds (agent → server)").

The session is the one the server labelled the container with when it created it (the sandbox
cannot change its labels), and every frame of a channel belongs to that container: so a stream
needs no address check. A session without an ALLOWLIST policy (or whose proxy is gone) gets
RESET `REFUSED` with the reason; any other kind the agent may not open gets `INVALID`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from sandboxd.agent.byte_stream import ByteStream, peer_of, serve_stream
from sandboxd.agent.channel import Channel, PeerOpen

log = logging.getLogger(__name__)


class EgressAcceptor(Protocol):
    """One session's proxy (sandboxd.egress.proxy.EgressProxy)."""

    read_limit: int

    def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None: ...


class EgressEndpoints(Protocol):
    """The server's proxies by session (sandboxd.egress.manager.EgressManager)."""

    def egress_port(self, session_id: str) -> int: ...

    def acceptor(self, session_id: str) -> EgressAcceptor | None: ...


def egress_port(endpoints: EgressEndpoints | None, session_id: str) -> int:
    """HELLO's `egress_port` for the sandbox of `session_id`: 0 unless it has a proxy."""
    if endpoints is None or not session_id:
        return 0
    return endpoints.egress_port(session_id)


def peer_open_handler(endpoints: EgressEndpoints | None, session_id: str) -> PeerOpen:
    """The channel's handler for the streams its agent opens."""

    def handle(channel: Channel, stream_id: int, request: dict[str, Any]) -> None:
        kind = request.get("kind")
        if kind != "egress":
            channel.refuse(stream_id, "INVALID", f"the agent may not open a {str(kind)[:32]!r}")
            return
        proxy = endpoints.acceptor(session_id) if endpoints and session_id else None
        if proxy is None:
            channel.refuse(
                stream_id,
                "REFUSED",
                f"session {session_id or '(none)'} has no ALLOWLIST network policy: "
                "this sandbox has no egress",
            )
            return
        stream = channel.accept(stream_id, "egress", ByteStream)
        serve_stream(
            stream,
            proxy.accept,
            limit=proxy.read_limit,
            extra={"peername": peer_of(request), "session_id": session_id},
            on_done=channel.release,
        )

    return handle
