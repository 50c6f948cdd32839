"""The door's listener: hypercorn serving `E2bApp` (HTTP/1.1 and HTTP/2, cleartext with prior
knowledge as E2B's SDK speaks it, or TLS with the gRPC port's certificate), and its one gRPC
channel to this server's own port. Entered into the server's exit stack after the gRPC server
has started; leaving it stops the listener, the door's PTYs and watchers, then the channel.

The socket listens from the start, but hypercorn (with h2, h11 and wsproto) and the app's
modules, some 4 MiB of RSS, are loaded when the first caller connects: until then the loop
only watches the listening socket, and the connection waits in its backlog for hypercorn's
first accept (the first call pays the loading once, a few hundred ms). A server whose door
nobody calls stays as small as one without a door."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

import grpc

from sandboxd.config import Config
from sandboxd.e2b.backend import Backend, loopback_target
from sandboxd.e2b.tokens import AccessTokens, load_key
from sandboxd.listener_caps import ConnectionCaps, listening

if TYPE_CHECKING:
    from sandboxd.e2b.app import E2bApp

log = logging.getLogger("sandboxd.e2b")


def _credentials(config: Config) -> tuple[grpc.ChannelCredentials | None, str | None]:
    """TLS toward the gRPC port when it serves TLS: its own certificate is the root, and the
    name checked is the one the certificate carries (`cryptography` is loaded only then)."""
    cert_path = config.tenancy.tls_cert
    if cert_path is None:
        return None, None
    from cryptography import x509

    pem = cert_path.read_bytes()
    cert = x509.load_pem_x509_certificate(pem)
    name: str | None = None
    with contextlib.suppress(x509.ExtensionNotFound):
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = names.get_values_for_type(x509.DNSName)
        ips = [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
        found = [*dns, *ips]
        name = found[0] if found else None
    if name is None:
        cn = cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
        name = str(cn[0].value) if cn else None
    return grpc.ssl_channel_credentials(root_certificates=pem), name


class _Lazy:
    """Hypercorn and the app, made by the first connection (`start`), on the door's socket."""

    def __init__(self, config: Config, backend: Backend, tokens: AccessTokens) -> None:
        self._config = config
        self._backend = backend
        self._tokens = tokens
        self.app: E2bApp | None = None
        self.task: asyncio.Task[None] | None = None
        self.stop = asyncio.Event()

    def start(self, sock: socket.socket) -> None:
        if self.task is None:
            self.task = asyncio.create_task(self._serve(sock), name="e2b door")

    async def _serve(self, sock: socket.socket) -> None:
        from hypercorn.asyncio.run import worker_serve
        from hypercorn.config import Config as HypercornConfig
        from hypercorn.config import Sockets
        from hypercorn.utils import wrap_app

        from sandboxd.e2b.app import E2bApp

        config = self._config
        self.app = E2bApp(
            self._backend,
            self._tokens,
            domain=config.e2b.domain,
            max_request_bytes=config.e2b.max_request_bytes,
            command_timeout_s=config.limits.max.command_timeout_s,
            pty_idle_s=config.leases.max_s,
        )
        hc = HypercornConfig()
        hc.accesslog = None
        hc.errorlog = log
        hc.keep_alive_timeout = 75  # the SDK keeps one connection per sandbox
        hc.h2_max_concurrent_streams = 256
        hc.graceful_timeout = 2
        tls = config.tenancy
        if tls.tls_cert is not None and tls.tls_key is not None:
            hc.certfile, hc.keyfile = str(tls.tls_cert), str(tls.tls_key)
        # The door's own listening socket, not one hypercorn makes from its descriptor: its
        # accept() keeps the door's connection caps (listener_caps.py).
        sockets = Sockets([sock], [], []) if hc.ssl_enabled else Sockets([], [sock], [])
        app = wrap_app(cast(Any, self.app), hc.wsgi_max_body_size, None)
        await worker_serve(app, hc, sockets=sockets, shutdown_trigger=self.stop.wait)


@contextlib.asynccontextmanager
async def door(config: Config, grpc_port: int) -> AsyncIterator[int]:
    """Serve the door for as long as the context is open; the port it listens on."""
    credentials, name = _credentials(config)
    backend = Backend.open(loopback_target(config.server.listen, grpc_port), credentials, name)
    lazy = _Lazy(config, backend, AccessTokens(load_key(config.server.data_dir)))
    caps = ConnectionCaps("E2B door", config.e2b.max_clients, config.e2b.max_clients_per_source)
    sock = listening(config.e2b.listen, "e2b_listen", caps)
    port = int(sock.getsockname()[1])
    loop = asyncio.get_running_loop()

    def first_caller() -> None:
        # Readable: a connection waits in the backlog. Not accepted here: hypercorn's server
        # takes it, with this socket's own (capped) accept.
        loop.remove_reader(sock.fileno())
        lazy.start(sock)

    loop.add_reader(sock.fileno(), first_caller)
    tls = config.tenancy.tls_cert is not None and config.tenancy.tls_key is not None
    log.info(
        "E2B door on %s://%s:%d",
        "https" if tls else "http",
        config.e2b.listen.rpartition(":")[0],
        port,
    )
    try:
        yield port
    finally:
        if lazy.task is None:  # else the first caller took the reader off
            loop.remove_reader(sock.fileno())
        lazy.stop.set()
        if lazy.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(lazy.task, 10)
        if lazy.app is not None:
            await lazy.app.close()
        await backend.close()
        sock.close()  # hypercorn's server closed it with itself, when it served: a no-op
