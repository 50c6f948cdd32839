"""Open connections capped at accept (listener_caps.py), on the listeners a library serves: a
connection past its source's cap or the listener's is closed before a byte is read, the places
of others are untouched, and a place given back serves again. On a bare asyncio server (what
both libraries run on), the E2B door's hypercorn and the web gateway's aiohttp, each real, on
loopback (127.0.0.2 and 127.0.0.3 are other sources: all of 127/8 is this host's)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sandboxd.config import load_config
from sandboxd.listener_caps import REFUSED_PER_ACCEPT, CappedListener, ConnectionCaps, listening

HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


async def _open(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def _closed_unread(sock: socket.socket, wait_s: float = 3.0) -> bool:
    """The server closed it (EOF or reset) within `wait_s`, having answered nothing."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(wait_s):
            return await loop.sock_recv(sock, 1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def _answers(sock: socket.socket, request: bytes, wait_s: float = 5.0) -> bytes:
    """The first bytes of the answer to `request` (b"" when closed instead)."""
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, request)
    async with asyncio.timeout(wait_s):
        with contextlib.suppress(ConnectionResetError):
            return await loop.sock_recv(sock, 12)
    return b""


@contextlib.asynccontextmanager
async def _echo(caps: ConnectionCaps) -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
        writer.close()

    listener = listening("127.0.0.1:0", "test_listen", caps)
    server = await asyncio.start_server(echo, sock=listener)
    try:
        yield listener.getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_past_a_sources_cap_or_the_listeners_a_connection_is_closed_unread() -> None:
    caps = ConnectionCaps("test", max_open=5, max_per_source=3)
    async with _echo(caps) as port:
        first = [await _open(port) for _ in range(5)]
        held = [s for s in first if await _answers(s, b"ping") == b"ping"]
        assert len(held) == 3  # the source's cap
        assert all([await _closed_unread(s) for s in first if s not in held])
        others = [await _open(port, "127.0.0.2") for _ in range(2)]
        assert [await _answers(s, b"ping") for s in others] == [b"ping"] * 2
        third = await _open(port, "127.0.0.3")  # within its source's cap, past the listener's
        assert await _closed_unread(third)
        assert (caps.open, caps.held_by("127.0.0.1"), caps.refused) == (5, 3, 3)
        held[0].close()  # a place given back serves again, from the same source
        again = None
        for _ in range(100):
            if caps.open == 4:
                again = await _open(port)
                break
            await asyncio.sleep(0.02)
        assert again is not None and await _answers(again, b"pong") == b"pong"
        for s in [*first, *others, third, again]:
            s.close()
        for _ in range(100):
            if caps.open == 0:
                break
            await asyncio.sleep(0.02)
        assert caps.open == 0 and caps.held_by("127.0.0.1") == 0


async def test_a_flood_past_the_cap_is_closed_in_turns_and_the_loop_goes_on() -> None:
    """A backlog of refused connections is closed REFUSED_PER_ACCEPT at a time, between the
    loop's other work: a timer set meanwhile still fires on time."""
    caps = ConnectionCaps("test", max_per_source=1)
    async with _echo(caps) as port:
        keep = await _open(port)
        assert await _answers(keep, b"x") == b"x"
        flood = [await _open(port) for _ in range(REFUSED_PER_ACCEPT * 3)]
        started = time.monotonic()
        await asyncio.sleep(0.01)
        assert time.monotonic() - started < 1.0
        assert all(await asyncio.gather(*(_closed_unread(s) for s in flood)))
        assert await _answers(keep, b"y") == b"y"
        for s in [keep, *flood]:
            s.close()


def test_a_held_connection_gives_its_place_back_once() -> None:
    caps = ConnectionCaps("test", max_per_source=1)
    with listening("127.0.0.1:0", "test_listen", caps) as listener:
        client = socket.create_connection(listener.getsockname())
        conn, _ = listener.accept()
        assert caps.open == 1
        conn.close()
        conn.close()
        assert caps.open == 0 and caps.held_by("127.0.0.1") == 0
        client.close()


def test_a_listen_address_that_cannot_be_bound_names_its_setting() -> None:
    from sandboxd.errors import ConfigError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ConfigError, match=f"e2b_listen {address}"):
            listening(address, "e2b_listen", ConnectionCaps("test"))


def _config(tmp_path: Path, *flags: str) -> object:
    return load_config(["--data-dir", str(tmp_path), *flags], env={})


async def test_the_e2b_door_closes_a_sources_connections_past_its_cap(tmp_path: Path) -> None:
    """The door's hypercorn serves its own capped socket: two connections from one address
    are answered, the third is closed unread; another address is served. Its backend points
    at a port that serves nothing: /health is answered by the door alone."""
    from sandboxd.e2b.listener import door

    config = _config(tmp_path, "--e2b-listen", "127.0.0.1:0", "--e2b-max-clients-per-source", "2")
    async with door(config, 9) as port:  # type: ignore[arg-type]
        first = [await _open(port) for _ in range(3)]
        answers = [await _answers(s, HEALTH, wait_s=20) for s in first[:2]]
        assert all(a.startswith(b"HTTP/1.1 200") for a in answers), answers
        assert await _closed_unread(first[2])
        other = await _open(port, "127.0.0.2")
        assert (await _answers(other, HEALTH)).startswith(b"HTTP/1.1 200")
        for s in [*first, other]:
            s.close()


async def test_the_web_gateway_closes_a_sources_connections_past_its_cap(tmp_path: Path) -> None:
    from sandboxd.server.transport import SERVICE_NAMES
    from sandboxd.web.gateway import WebGateway
    from sandboxd.web.methods import served_methods

    config = _config(tmp_path, "--web-listen", "127.0.0.1:0", "--web-max-clients-per-source", "2")
    gateway = WebGateway(
        config.web,  # type: ignore[attr-defined]
        "unix:/nonexistent/grpc.sock",
        served_methods(SERVICE_NAMES),
        tls=None,
        max_message_bytes=1 << 20,
    )
    options = b"OPTIONS /sandboxd.v1.SessionService/ListSessions HTTP/1.1\r\nHost: x\r\n\r\n"
    async with gateway:
        first = [await _open(gateway.port) for _ in range(3)]
        answers = [await _answers(s, options) for s in first[:2]]
        assert all(a.startswith(b"HTTP/1.1 ") for a in answers), answers
        assert await _closed_unread(first[2])
        other = await _open(gateway.port, "127.0.0.2")
        assert (await _answers(other, options)).startswith(b"HTTP/1.1 ")
        for s in [*first, other]:
            s.close()


def test_a_capped_listener_takes_over_the_descriptor_it_is_made_from() -> None:
    plain = socket.socket()
    plain.bind(("127.0.0.1", 0))
    plain.listen()
    address = plain.getsockname()
    capped = CappedListener(plain, ConnectionCaps("test"))
    assert plain.fileno() == -1 and capped.getsockname() == address
    capped.close()


async def test_the_e2b_door_over_tls_keeps_its_caps(tmp_path: Path) -> None:
    """Over TLS hypercorn serves the same capped socket (its secure sockets): the handshake
    and the answer for two connections of one address, the third closed before either."""
    import ssl

    from authutil import Pki
    from sandboxd.e2b.listener import door

    pki = Pki(tmp_path)
    cert, key = pki.server_for("127.0.0.1")
    config = _config(
        tmp_path / "data",
        "--e2b-listen",
        "127.0.0.1:0",
        "--e2b-max-clients-per-source",
        "2",
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
    )
    context = ssl.create_default_context(cafile=str(pki.ca_path))
    async with door(config, 9) as port:  # type: ignore[arg-type]
        held = []
        for _ in range(2):
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, ssl=context), 20
            )
            writer.write(HEALTH)
            assert (await asyncio.wait_for(reader.read(12), 20)).startswith(b"HTTP/1.1 200")
            held.append(writer)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=context), 5)
        for writer in held:
            writer.close()
