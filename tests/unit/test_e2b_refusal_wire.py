"""A refusal the door answers before it has read a request's body, over a real HTTP/1.1
connection: the client still writing that body must get the answer, not a broken pipe, and its
kept-alive connection must serve the next call (the SDK keeps one per sandbox)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
import pytest
from sandboxd.e2b import connect
from sandboxd.e2b.app import E2bApp
from sandboxd.e2b.backend import Backend
from sandboxd.e2b.tokens import AccessTokens

SID = "alpha.s-0123456789abcdef"


@contextlib.asynccontextmanager
async def door(max_request_bytes: int = 1 << 20) -> AsyncIterator[tuple[int, AccessTokens]]:
    """The app under hypercorn on a loopback port. Its backend's channel points at a port that
    serves nothing: every call here is refused before the backend is asked."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    tokens = AccessTokens(bytes(range(32)))
    channel = grpc.aio.insecure_channel("127.0.0.1:9")
    app = E2bApp(
        Backend(channel),
        tokens,
        domain="",
        max_request_bytes=max_request_bytes,
        command_timeout_s=60,
        pty_idle_s=60,
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    stop = asyncio.Event()
    task = asyncio.create_task(serve(cast(Any, app), config, shutdown_trigger=stop.wait))
    try:
        yield sock.getsockname()[1], tokens
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await channel.close()
        with contextlib.suppress(OSError):
            sock.close()


@contextlib.asynccontextmanager
async def connection(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    body = b""
    if "content-length" in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
    elif headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await asyncio.wait_for(reader.readline(), 10)).strip(), 16)
            chunk = await asyncio.wait_for(reader.readexactly(size + 2), 10)
            if size == 0:
                break
            body += chunk[:-2]
    return status, headers, body


def start_as_root(token: str, body: bytes) -> bytes:
    user = base64.b64encode(b"root:").decode()
    return (
        "POST /process.Process/Start HTTP/1.1\r\n"
        "Host: door\r\n"
        "Content-Type: application/connect+json\r\n"
        f"E2b-Sandbox-Id: {SID}\r\n"
        f"X-Access-Token: {token}\r\n"
        f"Authorization: Basic {user}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()


def end_error(body: bytes) -> dict[str, Any]:
    flags, size = struct.unpack(">BI", body[:5])
    assert flags & connect.FLAG_END_STREAM
    return cast(dict[str, Any], json.loads(body[5 : 5 + size])["error"])


async def test_a_refusal_before_the_body_reaches_a_client_still_sending_it() -> None:
    body = connect.envelope({"process": {"cmd": "id", "args": []}, "padding": "x" * 60_000})
    async with door() as (port, tokens):
        async with connection(port) as (reader, writer):
            writer.write(start_as_root(tokens.issue(SID, "key"), body))
            await writer.drain()
            await asyncio.sleep(0.3)  # the door has its headers, and answers from them alone
            for at in range(0, len(body), 4096):
                writer.write(body[at : at + 4096])
                await writer.drain()
                await asyncio.sleep(0.005)
            status, _, answer = await read_response(reader)
            assert status == 200
            error = end_error(answer)
            assert error["code"] == "permission_denied" and "root" in error["message"]
            # The same connection serves the next call.
            writer.write(b"GET /health HTTP/1.1\r\nHost: door\r\n\r\n")
            await writer.drain()
            status, _, _ = await read_response(reader)
            assert status == 200


async def test_a_refusal_before_a_large_body_ends_the_connection_with_the_answer() -> None:
    """Past what the door reads to keep a connection, the answer still comes and says the
    connection ends, so the client neither hangs nor reuses it."""
    body = connect.envelope({"padding": "x" * (3 << 20)})
    async with door(max_request_bytes=8 << 20) as (port, tokens):
        async with connection(port) as (reader, writer):
            writer.write(start_as_root(tokens.issue(SID, "key"), body))
            await writer.drain()
            sender = asyncio.create_task(_send_until_refused(writer, body))
            status, headers, answer = await read_response(reader)
            assert status == 200 and headers.get("connection") == "close"
            assert end_error(answer)["code"] == "permission_denied"
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender


async def _send_until_refused(writer: asyncio.StreamWriter, body: bytes) -> None:
    with contextlib.suppress(OSError):
        for at in range(0, len(body), 65536):
            writer.write(body[at : at + 65536])
            await writer.drain()


@pytest.mark.parametrize("what", ["a wrong access token", "an unknown path"])
async def test_other_refusals_before_the_body_keep_the_connection(what: str) -> None:
    body = connect.envelope({"padding": "y" * 20_000})
    async with door() as (port, tokens):
        token = "not-a-token" if what == "a wrong access token" else tokens.issue(SID, "key")
        path = "/process.Process/Start" if what == "a wrong access token" else "/nope.Nope/X"
        head = (
            f"POST {path} HTTP/1.1\r\nHost: door\r\n"
            "Content-Type: application/connect+json\r\n"
            f"E2b-Sandbox-Id: {SID}\r\nX-Access-Token: {token}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        async with connection(port) as (reader, writer):
            writer.write(head)
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.write(body)
            await writer.drain()
            status, _, _ = await read_response(reader)
            assert status in (200, 401, 404)
            writer.write(b"GET /health HTTP/1.1\r\nHost: door\r\n\r\n")
            await writer.drain()
            status, _, _ = await read_response(reader)
            assert status == 200
