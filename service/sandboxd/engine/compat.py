"""Every reach into aiodocker's and aiohttp's private attributes, behind a version check.

The Docker adapter needs four things those libraries do not offer publicly: starting an exec
stream before its first read (`Stream._init`), peeking at the frames already queued
(`Stream._queue` and its `_buffer`), splitting the agent's attached stdio with a parser of its
own (the connection protocol's `_payload_parser`: docker_demux.py says why) and half-closing
stdin (`Stream._resp`'s transport, and under TLS the TCP transport beneath asyncio's SSL
transport); plus the raw inspect document of a listed container (`DockerContainer._container`).
They live here and nowhere else, and `check_versions` refuses at start-up any library version
they were not checked against, with a message that says what to pin.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from importlib import metadata
from typing import Any

import aiodocker
import aiohttp
from aiodocker.containers import DockerContainer
from aiodocker.stream import Stream

from sandboxd.engine.docker_demux import Demux
from sandboxd.errors import ConfigError

# (distribution, supported major.minor prefixes); the pins in pyproject.toml sit inside these.
SUPPORTED = {
    "aiodocker": ("0.27.",),
    "aiohttp": ("3.14.",),
}


def check_versions() -> None:
    """Raise ConfigError unless the installed aiodocker/aiohttp are ones this module knows."""
    for dist, prefixes in SUPPORTED.items():
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            raise ConfigError(f"{dist} is not installed") from None
        if not version.startswith(prefixes):
            raise ConfigError(
                f"{dist} {version} is not supported by sandboxd's Docker adapter (it relies on "
                f"private attributes checked against {', '.join(p + 'x' for p in prefixes)}); "
                "install the version pinned in pyproject.toml"
            )


async def start_stream(stream: Stream) -> None:
    """Open the exec's hijacked connection now, so a failure surfaces at exec time."""
    await stream._init()


def demux_in_one_copy(stream: Stream, send_buffer: int = 0) -> bool:
    """Have a started stream's messages split by `Demux` (one copy of each byte) instead of
    aiodocker's parser, taking over what that parser holds of a message begun; with
    `send_buffer`, ask the kernel for that much room for what the stream writes (fewer
    partial sends, each of which asyncio's transport keeps and moves down in its buffer).
    False, with nothing changed, when the layout is not the one known."""
    resp = stream._resp
    connection = resp.connection if resp is not None else None
    protocol = connection.protocol if connection is not None else None
    old = getattr(protocol, "_payload_parser", None)
    pending = getattr(old, "_buf", None)
    if old is None or getattr(old, "tty", True) or not isinstance(pending, bytearray):
        return False
    protocol._payload_parser = Demux(old.queue, bytes(pending))  # type: ignore[union-attr]
    sock = protocol.transport.get_extra_info("socket") if protocol.transport else None  # type: ignore[union-attr]
    if send_buffer and sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    return True


def _frame_fd(entry: Any) -> int:
    """The fd of a frame waiting in aiodocker's queue ((Message, size) in aiohttp 3.14);
    -1 when the layout is not the one known, which makes read_buffered stop joining."""
    msg = entry[0] if isinstance(entry, tuple) and not hasattr(entry, "stream") else entry
    fd = getattr(msg, "stream", -1)
    return fd if isinstance(fd, int) and hasattr(msg, "data") else -1


async def read_buffered(stream: Stream, fd: int, parts: list[bytes], limit: int) -> None:
    """Append to `parts` the frames of `fd` that have already arrived, up to about `limit`
    bytes in all; never waits (only frames already in the queue are read)."""
    queue = stream._queue
    buffered = getattr(queue, "_buffer", None)
    size = sum(len(p) for p in parts)
    while queue is not None and buffered and size < limit and _frame_fd(buffered[0]) == fd:
        msg = await queue.read()
        parts.append(msg.data)
        size += len(msg.data)


def write_now(stream: Stream, data: bytes) -> bool:
    """Hand `data` to the connection's transport at once, as `write_in` does, when that needs
    no wait (its writes are not paused); False, with nothing written, when it would wait."""
    resp = stream._resp
    connection = resp.connection if resp is not None else None
    if stream._closed or connection is None:
        return False
    transport, protocol = connection.transport, connection.protocol
    if transport is None or transport.is_closing() or protocol is None:
        return False
    if protocol.writing_paused or protocol.transport is None:
        return False
    transport.write(data)
    return True


def write_eof(stream: Stream) -> None:
    """Half-close the exec's stdin; aiodocker's own close() drops the whole connection."""
    resp = stream._resp
    transport = resp.connection.transport if resp and resp.connection else None
    if transport is not None and not transport.can_write_eof():
        _write_eof_under_tls(transport)
    elif transport is not None:
        transport.write_eof()


def _write_eof_under_tls(transport: asyncio.BaseTransport) -> None:
    """A TLS engine (tcp://): asyncio's SSL transport cannot half-close, so end the TCP stream
    beneath it, as the docker CLI does (the engine reads EOF at a record boundary as the end of
    stdin). At the socket, once every record has left: the close_notify TLS sends at the end
    then meets a quiet EPIPE, where the transport's own write_eof would make it raise."""
    ssl_protocol = getattr(transport, "_ssl_protocol", None)
    raw = getattr(ssl_protocol, "_transport", None)
    if ssl_protocol is not None and raw is not None:
        _shutdown_when_flushed(ssl_protocol, raw, 0.002)


def _shutdown_when_flushed(ssl_protocol: Any, raw: asyncio.Transport, delay: float) -> None:
    if raw.is_closing():
        return
    if ssl_protocol._write_backlog or raw.get_write_buffer_size():
        # Records still queued (the engine reads slowly): look again, less often each time.
        loop = asyncio.get_running_loop()
        later = min(delay * 2, 0.1)
        loop.call_later(delay, _shutdown_when_flushed, ssl_protocol, raw, later)
        return
    sock = raw.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)


def container_document(container: DockerContainer) -> dict[str, Any]:
    """The list entry (Id, Names, Labels, State...) aiodocker keeps of a listed container."""
    return dict(container._container)


def events_query(
    docker: aiodocker.Docker, params: dict[str, str]
) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]:
    """GET /events as our own stream (aiodocker's `events` channel is one per client), with no
    total timeout: it runs for the server's life."""
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None, connect=5)
    return docker._query("events", params=params, timeout=timeout)
