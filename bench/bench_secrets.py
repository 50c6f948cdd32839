"""Secret injection cost: an HTTPS request through the intercepting path next to the same
request through a plain tunnel, and a 20 MiB upload both ways.

What runs where, as in a deployment: the client is `curl` (a separate process, as a program in
the sandbox is), the upstream an HTTPS server with a CA of its own in a child process (in a
deployment it is another machine, so it is a blocking one that takes as little of this
machine's CPU as it can: asyncio's TLS would cost it twice as much), and only the proxy runs in
this process, on its event loop (the server's proxies run on the server's loop); curl is
started from a thread of its own. Until 2026-11-30 client and upstream were asyncio code in
this process, sharing the proxy's GIL: that charged their TLS to the proxy's row. Only loopback
is used (the CONNECT names resolve to 127.0.0.1 in the proxy's static map).

The proxy is the server's own `EgressProxy` with a session `Interceptor` (per-session CA,
upstream verification, HTTP/1.1 relay, header injection, quotas and idle timeouts), fed by a
loopback listener (in a session, the agent's channel carries the connection instead; that hop
is not measured here). "ours" CONNECTs to the host the secret is bound to: the proxy terminates
curl's TLS with a leaf of the session CA, rewrites the head, and opens TLS of its own to the
upstream; "raw" is the same curl command, same upstream, same bytes, to the other name, an
unbound host: a plain CONNECT tunnel, TLS end to end between curl and the upstream. The
upstream answers with the bytes it received and whether the secret's header came, checked on
every sample. Times are curl's own `time_total` (CONNECT, TLS, request, answer; not its start).

Each metric also carries the proxy's CPU time (this thread: the proxy's loop alone), the
measure to compare code by on a shared machine. Intercepting costs the proxy one TLS decrypt
and one encrypt of every byte more than a tunnel (AES-256-GCM, about 0.5 ms per MiB alone) plus
asyncio's TLS layer (records read one by one, buffers copied): on 2 cores, where curl, the
upstream and the proxy share the CPU, that is what keeps the upload ratio around 0.8 rather
than above it (0.7-0.9 from run to run).

    secret_request_latency    open + CONNECT + TLS + GET answered, injected vs plain tunnel
                              (extra: `*_proxy_cpu_ms`, the proxy's CPU per request)
    secret_upload_throughput  MB/s of a 20 MiB POST, intercepted vs plain tunnel (target 0.8x)
                              (extra: `*_proxy_cpu_ms_per_mib`, the proxy's CPU per MiB)
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import socket
import socketserver
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, BinaryIO

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

from bench.common import (
    BenchContext,
    Metric,
    interleave,
    latency_metric,
    mb_per_s,
    throughput_metric,
)

UPLOAD_BYTES = 20 * 1024 * 1024
MIB = 1024 * 1024
CHUNK = 256 * 1024
HOSTS = ("secret.bench", "plain.bench")
CURL = "/usr/bin/curl"
SECRET = b"bench-secret-value"


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


class _Upstream(socketserver.BaseRequestHandler):
    """HTTP/1.1 keep-alive over TLS: each request's body is read and dropped; the answer is
    `<bytes> <auth>`, auth 1 when the request had an Authorization header with the bench's
    secret. Blocking, one thread per connection: a real upstream is another machine, so this
    one should take as little of the two cores as it can (asyncio's TLS costs twice as much)."""

    context: ssl.SSLContext

    def handle(self) -> None:
        # As servers do (and asyncio): the handshake's last flight is several small writes,
        # which Nagle would hold for the client's delayed ACK (40 ms).
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            with self.context.wrap_socket(self.request, server_side=True) as conn:
                self._serve(conn.makefile("rb", buffering=CHUNK), conn)
        except (OSError, ValueError):
            pass

    def _serve(self, r: BinaryIO, conn: ssl.SSLSocket) -> None:
        sink = memoryview(bytearray(CHUNK))
        while head := r.readline():
            length, auth = 0, 0
            while head not in (b"\r\n", b""):
                key, _, value = head.partition(b":")
                if key.lower() == b"content-length":
                    length = int(value)
                elif key.lower() == b"authorization" and SECRET in value:
                    auth = 1
                head = r.readline()
            got = 0
            while got < length and (n := r.readinto(sink[: min(CHUNK, length - got)])):
                got += n
            if got < length:
                return
            answer = f"{got} {auth}".encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True


def _serve_upstream(cert: str) -> None:
    """The child process: serve until killed; print the port first."""
    _Upstream.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _Upstream.context.load_cert_chain(cert)
    with _Server(("127.0.0.1", 0), _Upstream) as server:
        print(server.server_address[1], flush=True)
        server.serve_forever()


async def _start_proxy(port: int, ca_file: Path) -> tuple[EgressProxy, asyncio.Server]:
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
        sealed=vault.sealer.seal(SECRET, "API_KEY"),
    )
    upstream_ctx = ssl.create_default_context(cafile=str(ca_file))
    upstream_ctx.set_alpn_protocols(["http/1.1"])
    proxy = EgressProxy(
        "bench",
        Rules(HOSTS, frozenset({port}), allow_private_networks=True),
        quotas,
        Resolver({h: ("127.0.0.1",) for h in HOSTS}),
        AuditLog("bench"),
        # The server never dials loopback; the benchmark's upstream can only be there.
        protected=Protected(host_addresses=frozenset, always=()),
        interceptor=Interceptor("bench", "t", (binding,), False, vault, upstream_ctx),
    )
    # No listener of its own (the agent's channel hands it connections): a loopback one.
    listener = await asyncio.start_server(
        proxy.accept, "127.0.0.1", 0, limit=EgressProxy.read_limit
    )
    return proxy, listener


async def run(ctx: BenchContext) -> dict[str, Metric]:
    folder = Path(tempfile.mkdtemp(prefix="sandboxd-bench-secrets-"))
    ca_file, up_file = _tls_files(folder)
    body_file = folder / "upload.bin"
    body_file.write_bytes(os.urandom(UPLOAD_BYTES))
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.bench_secrets",
        "--upstream",
        str(up_file),
        cwd=Path(__file__).resolve().parents[1],
        stdout=asyncio.subprocess.PIPE,
    )
    listener: asyncio.Server | None = None
    proxy: EgressProxy | None = None
    try:
        assert child.stdout is not None
        port = int(await asyncio.wait_for(child.stdout.readline(), 30))
        proxy, listener = await _start_proxy(port, ca_file)
        assert proxy.interceptor is not None
        # curl trusts the upstream's CA (the tunnel) and the session CA (the interception),
        # as a sandbox's bundle holds the image's roots and the session CA.
        bundle = folder / "client-ca.pem"
        bundle.write_bytes(ca_file.read_bytes() + proxy.interceptor.ca.pem)
        proxy_port = listener.sockets[0].getsockname()[1]
        cpu: dict[str, list[float]] = {}

        async def curl(name: str, upload: bool) -> tuple[float, int]:
            """One curl run: (seconds of curl's time_total, bytes the upstream received)."""
            args = [
                CURL, "-q", "-sS", "--http1.1", "--noproxy", "",
                "--proxy", f"http://127.0.0.1:{proxy_port}", "--cacert", str(bundle),
                "-H", "Expect:", "-w", "\n%{http_code} %{time_total}",
            ]  # fmt: skip
            if upload:
                args += ["--data-binary", f"@{body_file}"]
            args.append(f"https://{name}:{port}/u")
            # Started and waited for in a thread of its own: this thread's CPU time is then
            # the proxy's loop alone.
            done = await asyncio.to_thread(
                subprocess.run,
                args,
                capture_output=True,
                check=False,
                env={"PATH": os.environ.get("PATH", ""), "HOME": str(folder)},
            )
            out, err = done.stdout, done.stderr
            answer, _, timing = out.decode().rpartition("\n")
            status, _, total = timing.partition(" ")
            got, _, auth = answer.partition(" ")
            if done.returncode != 0 or status != "200":
                raise RuntimeError(f"curl via {name}: {done.returncode} {out!r} {err!r}")
            if auth != ("1" if name == HOSTS[0] else "0"):
                raise RuntimeError(f"the upstream saw auth={auth} via {name}")
            return float(total), int(got)

        def sample(
            name: str, upload: bool, convert: Callable[[float], float]
        ) -> Callable[[], Coroutine[Any, Any, float]]:
            async def once() -> float:
                before = time.thread_time()
                seconds, got = await curl(name, upload)
                spent = (time.thread_time() - before) * 1000
                if got != (UPLOAD_BYTES if upload else 0):
                    raise RuntimeError(f"the upstream received {got} bytes via {name}")
                cpu.setdefault(f"{name} {upload}", []).append(spent)
                return convert(seconds)

            return once

        def cpu_extra(metric: Metric, upload: bool, key: str, per: float) -> Metric:
            for side, name in (("ours", HOSTS[0]), ("raw", HOSTS[1])):
                spent = cpu[f"{name} {upload}"][-metric.extra["samples"] :]
                metric.extra[f"{side}_proxy_{key}"] = round(statistics.median(spent) / per, 3)
            return metric

        def ms(seconds: float) -> float:
            return seconds * 1000

        def mbs(seconds: float) -> float:
            return mb_per_s(UPLOAD_BYTES, seconds)

        ours, raw = await interleave(ctx, sample(HOSTS[0], False, ms), sample(HOSTS[1], False, ms))
        results = {
            "secret_request_latency": cpu_extra(latency_metric(ours, raw), False, "cpu_ms", 1)
        }
        slow = dataclasses.replace(ctx, rounds=max(3, ctx.rounds // 5), warmup=1)
        ours, raw = await interleave(slow, sample(HOSTS[0], True, mbs), sample(HOSTS[1], True, mbs))
        results["secret_upload_throughput"] = cpu_extra(
            throughput_metric(ours, raw), True, "cpu_ms_per_mib", UPLOAD_BYTES / MIB
        )
        return results
    finally:
        if listener is not None:
            listener.close()
        if proxy is not None:
            await proxy.close()
        if child.returncode is None:
            child.kill()
        await child.wait()
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()


if __name__ == "__main__" and sys.argv[1:2] == ["--upstream"]:
    _serve_upstream(sys.argv[2])
