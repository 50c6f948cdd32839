"""The E2B door's refusals over the wire (HTTP/1.1, aiohttp), on a live server with two tenants:
what a hostile or broken caller gets, and that nothing is left behind. The SDK's own scenarios
are tests/clients/test_e2b_sdk.py."""

from __future__ import annotations

import io
import json
import secrets
import struct
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from authutil import write_tokens
from conftest import ServerProcess, remove_owned_containers, start_server
from e2butil import base_image_built, door_url

ALPHA, BETA = "door-alpha-" + secrets.token_hex(8), "door-beta-" + secrets.token_hex(8)
LIMIT = 1024 * 1024


pytestmark = pytest.mark.skipif(not base_image_built(), reason="make base-image")


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    tmp = tmp_path_factory.mktemp("e2b-door")
    tokens = write_tokens(tmp / "tokens", {ALPHA: "alpha", BETA: "beta"})
    srv = start_server(
        tmp / "data",
        "door" + secrets.token_hex(4),
        "--tokens-file",
        str(tokens),
        "--e2b-listen",
        "127.0.0.1:0",
        "--e2b-max-request-bytes",
        str(LIMIT),
    )
    try:
        yield srv, door_url(srv)
    finally:
        srv.stop()
        remove_owned_containers(srv.owner_id)


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _create(http: aiohttp.ClientSession, url: str, key: str = ALPHA) -> dict[str, Any]:
    async with http.post(
        f"{url}/sandboxes", json={"templateID": "base", "timeout": 120}, headers={"X-API-KEY": key}
    ) as r:
        assert r.status == 201, await r.text()
        body: dict[str, Any] = await r.json()
        return body


def _envd(sbx: dict[str, Any], token: str | None = None) -> dict[str, str]:
    return {
        "E2b-Sandbox-Id": sbx["sandboxID"],
        "X-Access-Token": token if token is not None else sbx["envdAccessToken"],
    }


def _frame(message: dict[str, Any] | bytes, flags: int = 0) -> bytes:
    raw = message if isinstance(message, bytes) else json.dumps(message).encode()
    return struct.pack(">BI", flags, len(raw)) + raw


def _end_error(body: bytes) -> dict[str, Any] | None:
    """The error of a Connect stream's end-of-stream frame (None for a clean end)."""
    while body:
        flags, size = struct.unpack(">BI", body[:5])
        payload, body = body[5 : 5 + size], body[5 + size :]
        if flags & 0x02:
            end: dict[str, Any] = json.loads(payload)
            return end.get("error")
    raise AssertionError("no end-of-stream frame")


async def _run(
    http: aiohttp.ClientSession, url: str, sbx: dict[str, Any], cmd: str
) -> dict[str, Any] | None:
    body = _frame({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}})
    async with http.post(
        f"{url}/process.Process/Start",
        data=body,
        headers={**_envd(sbx), "Content-Type": "application/connect+json"},
    ) as r:
        return _end_error(await r.read())


@pytest.mark.asyncio
async def test_rest_refusals(door: tuple[ServerProcess, str], http: aiohttp.ClientSession) -> None:
    srv, url = door
    for headers in ({}, {"X-API-KEY": "wrong"}, {"X-API-KEY": "bad key"}):
        async with http.post(f"{url}/sandboxes", json={"templateID": "base"}, headers=headers) as r:
            assert r.status == 401, await r.text()
    key = {"X-API-KEY": ALPHA}
    for field, value in (
        ("allow_internet_access", True),
        ("autoPause", True),
        ("volumeMounts", [{"name": "v", "path": "/data"}]),
        ("mcp", {"x": {}}),
    ):
        async with http.post(
            f"{url}/sandboxes", json={"templateID": "base", field: value}, headers=key
        ) as r:
            assert r.status == 400 and field in (await r.json())["message"]
    async with http.post(f"{url}/sandboxes", data=b"[1]", headers=key) as r:
        assert r.status == 400
    async with http.get(f"{url}/sandboxes", headers=key) as r:
        assert r.status == 200 and await r.json() == []  # nothing was created by any of it
    sbx = await _create(http, url)
    async with http.post(
        f"{url}/sandboxes/{sbx['sandboxID']}/pause", json={"memory": True}, headers=key
    ) as r:
        assert r.status == 400
    async with http.get(f"{url}/sandboxes/{sbx['sandboxID']}/metrics", headers=key) as r:
        assert r.status == 501
    # Another tenant: not found, and the sandbox runs on.
    other = {"X-API-KEY": BETA}
    async with http.get(f"{url}/sandboxes/{sbx['sandboxID']}", headers=other) as r:
        assert r.status == 404
    async with http.delete(f"{url}/sandboxes/{sbx['sandboxID']}", headers=other) as r:
        assert r.status == 404
    async with http.get(f"{url}/sandboxes/{sbx['sandboxID']}", headers=key) as r:
        assert r.status == 200 and (await r.json())["state"] == "running"
    # The door's calls are the tenant's own: the access log names the tenant of each.
    creates = [line for line in srv.log_lines if '"SessionService/CreateSession OK' in line]
    assert creates and all('"tenant": "alpha"' in line for line in creates), creates


@pytest.mark.asyncio
async def test_envd_refusals(door: tuple[ServerProcess, str], http: aiohttp.ClientSession) -> None:
    _, url = door
    a, b = await _create(http, url), await _create(http, url)
    stat = f"{url}/filesystem.Filesystem/Stat"
    body = {"path": "/home/user"}
    # A's token with B's id, a forged token, none.
    for headers in (
        {"E2b-Sandbox-Id": b["sandboxID"], "X-Access-Token": a["envdAccessToken"]},
        _envd(a, a["envdAccessToken"][:-4] + "AAAA"),
        {"E2b-Sandbox-Id": a["sandboxID"]},
    ):
        async with http.post(stat, json=body, headers=headers) as r:
            assert r.status == 401 and (await r.json())["code"] == "unauthenticated"
    async with http.post(stat, json=body, headers=_envd(a)) as r:
        assert r.status == 200 and (await r.json())["entry"]["path"] == "/home/user"
    async with http.post(stat, json={"path": "/etc/passwd"}, headers=_envd(a)) as r:
        assert r.status == 400 and "outside" in (await r.json())["message"]
    start = f"{url}/process.Process/Start"
    stream = {**_envd(a), "Content-Type": "application/connect+json"}
    cmd = {"process": {"cmd": "/bin/bash", "args": ["-c", "touch /home/user/ran"]}}
    for bad, code in (
        (_frame(cmd, flags=0x01), "unimplemented"),
        (_frame(cmd, flags=0x02), "invalid_argument"),
        (_frame(b"{not json"), "invalid_argument"),
        (_frame(cmd)[:-3], "invalid_argument"),
        (_frame(cmd) + _frame(cmd), "invalid_argument"),
        (struct.pack(">BI", 0, 100 * 1024 * 1024), "resource_exhausted"),
    ):
        async with http.post(start, data=bad, headers=stream) as r:
            assert r.status == 200
            error = _end_error(await r.read())
            assert error is not None and error["code"] == code, (bad[:8], error)
    # None of them started anything.
    async with http.post(stat, json={"path": "ran"}, headers=_envd(a)) as r:
        assert r.status == 404
    assert await _run(http, url, a, "true") is None
    # A non-zero exit is an end event, not an error.
    assert await _run(http, url, a, "exit 4") is None


@pytest.mark.asyncio
async def test_numbers_no_codec_would_read_are_refused_not_failed(
    door: tuple[ServerProcess, str], http: aiohttp.ClientSession
) -> None:
    """Superscript digits pass `str.isdigit()` and fail `int()`; a pty size past uint32 fails
    protobuf. Each is the caller's mistake (400 / invalid_argument), never a 500 or a stream
    cut short, and starts nothing."""
    _, url = door
    sbx = await _create(http, url)
    for limit in ("\u00b2", "1\u00b3", "\u0661\u0662"):
        async with http.get(
            f"{url}/v2/sandboxes", params={"limit": limit}, headers={"X-API-KEY": ALPHA}
        ) as r:
            assert r.status == 400, (limit, r.status, await r.text())
    list_dir = f"{url}/filesystem.Filesystem/ListDir"
    async with http.post(
        list_dir, json={"path": "/home/user", "depth": "\u00b2"}, headers=_envd(sbx)
    ) as r:
        assert r.status == 400 and (await r.json())["code"] == "invalid_argument"
    start = f"{url}/process.Process/Start"
    stream = {**_envd(sbx), "Content-Type": "application/connect+json"}
    for size in ({"rows": 2**32, "cols": 80}, {"rows": 24, "cols": 1001}):
        cmd = {
            "process": {"cmd": "/bin/bash", "args": ["-c", "touch /home/user/ran"]},
            "pty": {"size": size},
        }
        async with http.post(start, data=_frame(cmd), headers=stream) as r:
            assert r.status == 200
            error = _end_error(await r.read())
            assert error is not None and error["code"] == "invalid_argument", (size, error)
    async with http.post(
        f"{url}/filesystem.Filesystem/Stat", json={"path": "ran"}, headers=_envd(sbx)
    ) as r:
        assert r.status == 404


@pytest.mark.asyncio
async def test_a_huge_upload_is_413_and_leaves_nothing(
    door: tuple[ServerProcess, str], http: aiohttp.ClientSession
) -> None:
    _, url = door
    sbx = await _create(http, url)
    files = f"{url}/files?path=/home/user/big.bin"
    octet = {**_envd(sbx), "Content-Type": "application/octet-stream"}
    async with http.post(files, data=io.BytesIO(b"x" * (LIMIT + 1)), headers=octet) as r:
        assert r.status == 413  # its Content-Length says so: refused before it is read
        assert r.headers.get("Connection") == "close"  # the unread rest ends with it

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(LIMIT // 65536 + 2):
            yield b"y" * 65536

    async with http.post(files, data=chunks(), headers=octet) as r:  # chunked: no length
        assert r.status == 413
    async with http.post(
        f"{url}/filesystem.Filesystem/ListDir", json={"path": "/home/user"}, headers=_envd(sbx)
    ) as r:
        assert r.status == 200 and (await r.json()).get("entries", []) == []
    async with http.post(files, data=b"small", headers=octet) as r:
        assert r.status == 200 and (await r.json())[0]["path"] == "/home/user/big.bin"
    async with http.get(files, headers=_envd(sbx)) as r:
        assert r.status == 200 and await r.read() == b"small"
