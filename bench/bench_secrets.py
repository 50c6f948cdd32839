"""Secret injection cost: an HTTPS request through the intercepting path next to the same
request through a plain tunnel, and a 20 MiB upload both ways.

The proxy is the server's own `EgressProxy` with a session `Interceptor` (per-session CA,
upstream verification, HTTP/1.1 relay, header injection), on its own event loop in a thread as
in the server; the upstream is a local HTTPS server with a CA of its own. "raw" is the same
client, same upstream, through a plain CONNECT tunnel (TLS end to end). Only loopback is used.

    secret_request_latency    open + CONNECT + TLS + GET answered, injected vs plain tunnel
    secret_upload_throughput  MB/s of a 20 MiB POST, intercepted vs plain tunnel (target 0.8x)
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sandboxd.egress.addresses import Protected
from sandboxd.egress.audit import AuditLog
from sandboxd.egress.policy import DEFAULT_QUOTAS, ResolvedQuotas
from sandboxd.egress.proxy import EgressProxy, Rules
from sandboxd.egress.resolver import Resolver
from sandboxd.models import SecretBinding
from sandboxd.secrets.interceptor import Interceptor
from sandboxd.secrets.vault import Vault

from bench.bench_egress import _Host
from bench.common import (
    BenchContext,
    Metric,
    interleave,
    latency_metric,
    mb_per_s,
    throughput_metric,
    timed_ms,
)

UPLOAD_BYTES = 20 * 1024 * 1024
CHUNK = 256 * 1024
HOSTS = ("secret.bench", "plain.bench")


def _tls_files(folder: Path) -> tuple[Path, Path]:
    """(CA bundle, key+cert of the upstream for both names)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTS[0])]))
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in HOSTS]), False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "up.pem").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + leaf.public_bytes(pem)
    )
    return folder / "ca.pem", folder / "up.pem"


async def _upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    """HTTP/1.1 keep-alive: each request's body is read and its length answered."""
    try:
        while head := await r.readuntil(b"\r\n\r\n"):
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            while length > 0:
                length -= len(await r.read(min(CHUNK, length)))
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        w.close()


async def run(ctx: BenchContext) -> dict[str, Metric]:
    folder = Path(tempfile.mkdtemp(prefix="sandboxd-bench-secrets-"))
    ca_file, up_file = _tls_files(folder)
    # The upstream on a loop of its own: in the server process the proxy does not share its
    # thread with the upstream's TLS.
    with _Host() as host, _Host() as remote:

        async def serve() -> asyncio.Server:
            server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server_ctx.load_cert_chain(up_file)
            return await asyncio.start_server(_upstream, "127.0.0.1", 0, ssl=server_ctx)

        upstream = await remote.call(serve)
        port = upstream.sockets[0].getsockname()[1]

        async def start() -> tuple[EgressProxy, asyncio.Server]:
            quotas = dataclasses.replace(
                ResolvedQuotas.of(DEFAULT_QUOTAS), max_bytes_up=1 << 50, max_requests=1 << 40
            )
            vault = Vault()
            binding = SecretBinding(
                name="API_KEY",
                hosts=(HOSTS[0],),
                header="Authorization",
                template="Bearer {secret}",
                placeholder="sbx_secret_" + "0" * 40,
                sealed=vault.sealer.seal(b"bench-secret-value", "API_KEY"),
            )
            upstream_ctx = ssl.create_default_context(cafile=str(ca_file))
            upstream_ctx.set_alpn_protocols(["http/1.1"])
            proxy = EgressProxy(
                "bench",
                Rules(HOSTS, frozenset({port}), allow_private_networks=True),
                quotas,
                Resolver({h: ("127.0.0.1",) for h in HOSTS}),
                AuditLog("bench"),
                protected=Protected(host_addresses=frozenset, always=()),
                interceptor=Interceptor("bench", "t", (binding,), False, vault, upstream_ctx),
            )
            # No listener of its own (the agent's channel hands it connections): a loopback one.
            listener = await asyncio.start_server(
                proxy.accept, "127.0.0.1", 0, limit=EgressProxy.read_limit
            )
            return proxy, listener

        proxy, listener = await host.call(start)
        proxy_address = listener.sockets[0].getsockname()[:2]
        assert proxy.interceptor is not None
        client_ctx = ssl.create_default_context(cafile=str(ca_file))
        client_ctx.load_verify_locations(cadata=proxy.interceptor.ca.pem.decode())
        body = os.urandom(CHUNK)
        try:

            async def open_via(name: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
                r, w = await asyncio.open_connection(*proxy_address, limit=CHUNK)
                w.write(f"CONNECT {name}:{port} HTTP/1.1\r\n\r\n".encode())
                status = await r.readuntil(b"\r\n\r\n")
                if not status.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"proxy refused: {status!r}")
                await w.start_tls(client_ctx, server_hostname=name)
                return r, w

            async def answered(r: asyncio.StreamReader) -> None:
                head = await r.readuntil(b"\r\n\r\n")
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"upstream answered {head[:60]!r}")
                await r.readexactly(2)

            def request(name: str) -> Callable[[], Coroutine[Any, Any, float]]:
                async def sample() -> float:
                    async def once() -> None:
                        r, w = await open_via(name)
                        w.write(f"GET / HTTP/1.1\r\nHost: {name}\r\n\r\n".encode())
                        await answered(r)
                        w.close()

                    return await timed_ms(once)

                return sample

            def upload(name: str) -> Callable[[], Coroutine[Any, Any, float]]:
                async def sample() -> float:
                    start = time.perf_counter()
                    r, w = await open_via(name)
                    w.write(
                        f"POST /u HTTP/1.1\r\nHost: {name}\r\n"
                        f"Content-Length: {UPLOAD_BYTES}\r\n\r\n".encode()
                    )
                    left = UPLOAD_BYTES
                    while left > 0:
                        w.write(body[: min(CHUNK, left)])
                        left -= CHUNK
                        await w.drain()
                    await answered(r)
                    w.close()
                    return mb_per_s(UPLOAD_BYTES, time.perf_counter() - start)

                return sample

            ours, raw = await interleave(ctx, request(HOSTS[0]), request(HOSTS[1]))
            results = {"secret_request_latency": latency_metric(ours, raw)}
            slow = dataclasses.replace(ctx, rounds=max(3, ctx.rounds // 5), warmup=1)
            ours, raw = await interleave(slow, upload(HOSTS[0]), upload(HOSTS[1]))
            results["secret_upload_throughput"] = throughput_metric(ours, raw)
            return results
        finally:

            async def stop() -> None:
                listener.close()
                await proxy.close()

            async def stop_upstream() -> None:
                upstream.close()
                await upstream.wait_closed()

            await host.call(stop)
            await remote.call(stop_upstream)
