# ruff: noqa: E501 (the sandbox's echo server is one string of python with long lines)
"""Previews: a request's latency and a 20 MiB download through the preview listener,
each next to the same fetch made by a client inside the sandbox through `docker exec` (busybox
`wget -O -`, its output drained by aiodocker), and a WebSocket round trip.

A second server runs with `--preview-listen`; the sandbox serves with busybox `httpd` (and, for
the WebSocket row, python's stdlib in the Debian image when it is built). Only loopback is used.

    preview_request_latency      GET of a small file: preview vs docker exec + wget
    preview_download_throughput  MB/s of a 20 MiB file: preview vs docker exec + wget (>= 1.0x)
    preview_websocket_rtt        one 64-byte message echoed over an open WebSocket (ours only)
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
from google.protobuf import duration_pb2
from sandboxd.v1 import (
    common_pb2,
    filesystem_pb2,
    filesystem_pb2_grpc,
    previews_pb2,
    process_pb2,
    process_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)

from bench.common import (
    BenchContext,
    Metric,
    interleave,
    latency_metric,
    mb_per_s,
    throughput_metric,
    timed_ms,
)

DOWNLOAD_BYTES = 20 * 1024 * 1024
PYTHON_IMAGE = "sandboxd-runtime:python"
WS_ECHO = r"""
import base64, hashlib, socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7001)); s.listen(4)
def exact(c, n):
    b = b""
    while len(b) < n:
        m = c.recv(n - len(b))
        if not m: raise EOFError
        b += m
    return b
while True:
    c, _ = s.accept()
    h = b""
    while b"\r\n\r\n" not in h: h += c.recv(4096)
    key = [l.split(b":", 1)[1].strip() for l in h.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key")][0]
    acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    try:
        while True:
            b0, b1 = exact(c, 2); n = b1 & 127
            if n == 126: n = int.from_bytes(exact(c, 2), "big")
            mask = exact(c, 4)
            data = bytes(x ^ mask[i % 4] for i, x in enumerate(exact(c, n)))
            if b0 & 15 == 8: break
            c.sendall(bytes([0x80 | (b0 & 15), n]) + data if n < 126 else bytes([0x80 | (b0 & 15), 126]) + n.to_bytes(2, "big") + data)
    except EOFError:
        pass
    c.close()
"""


class _Preview:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.sessions = session_pb2_grpc.SessionServiceStub(channel)
        self.processes = process_pb2_grpc.ProcessServiceStub(channel)
        self.files = filesystem_pb2_grpc.FilesystemServiceStub(channel)

    @contextlib.asynccontextmanager
    async def session(self, **fields: object) -> AsyncIterator[str]:
        req = session_pb2.CreateSessionRequest(
            shell=common_pb2.ShellPolicy(allow_all=True),
            **fields,  # type: ignore[arg-type]
        )
        sid = (await self.sessions.CreateSession(req)).session.session_id
        try:
            yield sid
        finally:
            with contextlib.suppress(grpc.RpcError):
                await self.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))

    async def start(self, sid: str, *argv: str) -> None:
        await self.processes.StartProcess(
            process_pb2.StartProcessRequest(
                session_id=sid, argv=list(argv), timeout=duration_pb2.Duration(seconds=3600)
            )
        )

    async def publish(self, sid: str, port: int) -> previews_pb2.Preview:
        req = previews_pb2.PublishPortRequest(session_id=sid, port=port)
        return (await self.sessions.PublishPort(req)).preview


def _loopback(preview: previews_pb2.Preview) -> str:
    port = preview.path_url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
    return f"http://127.0.0.1:{port}/" + preview.path_url.split("/", 3)[3]


async def _container(ctx: BenchContext, sid: str) -> str:
    found = await ctx.docker.containers.list(
        all=True, filters={"label": [f"io.sandboxd.session={sid}"]}
    )
    return str(found[0].id)


async def _until_up(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        async with http.get(url, headers=headers) as r:
            if r.status != 502:
                await r.read()
                return
    raise RuntimeError(f"{url} never answered")


async def run(ctx: BenchContext) -> dict[str, Metric]:
    from bench.run import running_server  # the runner's own way of starting a server

    results: dict[str, Metric] = {}
    with tempfile.TemporaryDirectory(prefix="sandboxd-bench-previews-") as tmp:
        async with (
            running_server(Path(tmp), "--preview-listen", "127.0.0.1:0") as server,
            grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
            aiohttp.ClientSession() as http,
        ):
            api = _Preview(channel)
            async with api.session() as sid:
                await api.files.WriteFile(
                    filesystem_pb2.WriteFileRequest(
                        session_id=sid, path="www/small", content=b"x" * 512, make_parents=True
                    )
                )
                made = await api.processes.Run(
                    process_pb2.RunRequest(
                        session_id=sid,
                        argv=["sh", "-c", f"head -c {DOWNLOAD_BYTES} /dev/urandom > www/big"],
                    )
                )
                assert made.exit_code == 0, made
                await api.start(sid, "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/workspace/www")
                preview = await api.publish(sid, 8080)
                base, hdr = _loopback(preview), {"X-Sandboxd-Token": preview.token}
                await _until_up(http, base + "small", hdr)
                container = await _container(ctx, sid)

                async def fetch(name: str) -> int:
                    n = 0
                    async with http.get(base + name, headers=hdr) as r:
                        assert r.status == 200, r.status
                        async for chunk in r.content.iter_chunked(256 * 1024):
                            n += len(chunk)
                    return n

                async def wget(name: str) -> int:
                    url = f"http://127.0.0.1:8080/{name}"
                    code, n = await ctx.raw_exec(container, ["wget", "-q", "-O", "-", url])
                    assert code == 0, code
                    return n

                async def small_ours() -> float:
                    return await timed_ms(lambda: fetch("small"))

                async def small_raw() -> float:
                    return await timed_ms(lambda: wget("small"))

                ours, raw = await interleave(ctx, small_ours, small_raw)
                results["preview_request_latency"] = latency_metric(ours, raw)

                async def big(get: object) -> float:
                    start = time.perf_counter()
                    n = await get("big")  # type: ignore[operator]
                    assert n == DOWNLOAD_BYTES, n
                    return mb_per_s(n, time.perf_counter() - start)

                ours, raw = await interleave(ctx, lambda: big(fetch), lambda: big(wget))
                results["preview_download_throughput"] = throughput_metric(ours, raw)

            if await _python_image(ctx):
                async with api.session(image=PYTHON_IMAGE) as sid:
                    await api.files.WriteFile(
                        filesystem_pb2.WriteFileRequest(
                            session_id=sid, path="ws.py", content=WS_ECHO.encode()
                        )
                    )
                    await api.start(sid, "python3", "/workspace/ws.py")
                    preview = await api.publish(sid, 7001)
                    results["preview_websocket_rtt"] = await _ws_rtt(ctx, http, preview)
    return results


async def _python_image(ctx: BenchContext) -> bool:
    try:
        await ctx.docker.images.inspect(PYTHON_IMAGE)
    except Exception:
        return False
    return True


async def _ws_rtt(
    ctx: BenchContext, http: aiohttp.ClientSession, preview: previews_pb2.Preview
) -> Metric:
    hdr = {"X-Sandboxd-Token": preview.token}
    deadline = time.monotonic() + 30
    while True:
        try:
            ws = await http.ws_connect(_loopback(preview), headers=hdr)
            break
        except aiohttp.WSServerHandshakeError:
            if time.monotonic() > deadline:
                raise
    samples: list[float] = []
    async with ws:
        for i in range(ctx.warmup + ctx.rounds * 3):
            start = time.perf_counter()
            await ws.send_bytes(b"p" * 64)
            msg = await ws.receive(timeout=10)
            assert msg.data == b"p" * 64, msg
            if i >= ctx.warmup:
                samples.append((time.perf_counter() - start) * 1000)
    return latency_metric(samples, None)
