"""The preview listener: HTTP(S) on `preview_listen`, relaying to ports inside sandboxes.

Why asyncio streams and not aiohttp's web server: aiohttp parses every message into its own
objects and writes its own (it de-chunks request bodies, re-chunks streamed answers, and
takes over an upgraded connection only through its WebSocketResponse, which re-frames the
messages; its public API never hands the raw connection over after a 101). A preview must pass
chunked bodies, Server-Sent Events and WebSocket frames through unchanged, so the listener
frames HTTP/1.1 itself (`http1`) and relays bytes (`relay`); TLS is the standard library's.

Each client connection is one task, owned here and cancelled at shutdown, and held under
`admission`: pending (its own pool, a cap per source) until a request opened a preview, then
counted against that preview's tenant. A new connection's first head (its TLS handshake
included) must be whole within `head_timeout`, a kept-alive one's next head within
`head_timeout` of its first byte. Every request is routed and checked again (`access`), so a
keep-alive or pipelined connection can never carry a request to a preview its own token does
not open; its connection to the sandbox is reused only while requests go to the same session,
port and publication and the sandbox sent nothing beyond its answers, and it becomes a tunnel
only for an upgrade both ends agreed on (`upgrade`). Answers: 400 malformed request, 401/403/404
(access), 404 session not running, 408 no whole head in time, 429 over a session's preview
limits or the tenant's connections, 502 nothing answers on the port or the sandbox answered
what cannot be relayed, 503 the listener or the source is full, 504 the sandbox did not begin
its answer within `preview_timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http
import logging
import ssl
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

from sandboxd.audit.events import AuditEvent
from sandboxd.config_sections.previews import PreviewsSection
from sandboxd.listener_caps import source_of
from sandboxd.models import SessionState
from sandboxd.previews import access, http1, upgrade
from sandboxd.previews.admission import Admission, Full, Ticket
from sandboxd.previews.connections import Connection, OpenConnections, OverLimit
from sandboxd.previews.dialer import BackendReset, ByteStream, PortDialer
from sandboxd.previews.metrics import PreviewMetrics
from sandboxd.previews.publishing import Address
from sandboxd.previews.registry import PortRegistry, Publication
from sandboxd.previews.relay import (
    BadRequestBody,
    ClientStream,
    Outcome,
    SandboxBroke,
    SandboxGone,
    SandboxSilent,
    exchange,
)
from sandboxd.previews.tokens import TokenSigner
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)

Audit = Callable[[AuditEvent], None]


class Refused(Exception):
    def __init__(self, status: int, why: str, message: str, headers: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status, self.why, self.message, self.headers = status, why, message, headers


def tls_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    if cert is None or key is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


class Backend:
    """The connection to one preview that a client connection holds (reused while the
    requests go to the same session, port and publication)."""

    def __init__(
        self, key: tuple[str, int, int], stream: ByteStream, conn: Connection, stack: AsyncExitStack
    ) -> None:
        self.key, self.stream, self.conn, self.stack = key, stream, conn, stack


class Link:
    """A client connection's current Backend (at most one; closed when replaced or at the end)."""

    def __init__(self) -> None:
        self.backend: Backend | None = None

    async def drop(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            with contextlib.suppress(Exception):
                await backend.stack.aclose()


class Broken(Exception):
    """The exchange failed after its answer began: the connection just ends."""


class PreviewListener:
    def __init__(
        self,
        settings: PreviewsSection,
        *,
        registry: PortRegistry,
        signer: TokenSigner,
        connections: OpenConnections,
        dialer: PortDialer,
        store: SessionStore,
        metrics: PreviewMetrics,
        audit: Audit,
        address: Address,
        tls: ssl.SSLContext | None,
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._signer = signer
        self._connections = connections
        self._dialer = dialer
        self._store = store
        self._metrics = metrics
        self._audit = audit
        self._address = address
        self._tls = tls
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._admission = Admission(
            settings.max_clients,
            settings.max_pending,
            settings.max_pending_per_source,
            settings.max_tenant_clients,
        )

    async def __aenter__(self) -> PreviewListener:
        host, _, port = self._settings.listen.rpartition(":")
        # TLS per connection (`_accept`), within the head's deadline and after admission: a
        # handshake that never ends is a pending connection like a head that never ends.
        self._server = await asyncio.start_server(self._accept, host.strip("[]"), int(port))
        bound = self._server.sockets[0].getsockname()
        self._address.scheme = "https" if self._tls else "http"
        self._address.host = host
        self._address.port = int(bound[1])
        log.info("previews on %s:%d (%s)", host, bound[1], self._address.scheme)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.head_timeout_s
        evicted = self._admission.evicted
        try:
            ticket = self._admission.arrive(source_of(writer.get_extra_info("peername")), task)
        except Full as full:
            # Before any byte is read: a flood of connections costs one buffered write each.
            self._metrics.refused.labels(full.why).inc()
            self._metrics.requests.labels("503").inc()
            if self._tls is None:
                writer.write(_refusal(Refused(503, full.why, full.message)))
            writer.close()
            return
        finally:
            if self._admission.evicted > evicted:
                self._metrics.refused.labels("evicted").inc(self._admission.evicted - evicted)
        self._tasks.add(task)
        self._metrics.connections.inc()
        link = Link()
        try:
            if self._tls is not None:
                async with asyncio.timeout_at(deadline):
                    await writer.start_tls(self._tls)
            client = ClientStream(reader, writer)
            first: float | None = deadline
            while await self._one(client, link, ticket, first):
                first = None
        except TimeoutError:  # the TLS handshake did not end within the head's deadline
            self._metrics.refused.labels("head_timeout").inc()
        except (asyncio.CancelledError, OSError, EOFError, http1.BadMessage):
            pass  # OSError: a reset, a failed TLS handshake (ssl.SSLError) alike
        finally:
            self._admission.leave(ticket)
            self._metrics.connections.dec()
            await link.drop()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._tasks.discard(task)

    async def _next_head(
        self, client: ClientStream, ticket: Ticket, deadline: float | None
    ) -> http1.Head | None:
        """The next request head, or None when the connection should just end. The head of a
        new connection must be whole by `deadline`; on a kept-alive one, the next request may
        wait `idle_timeout` for its first byte (the connection is idle until then: the first
        its tenant gives up for another's), then has `head_timeout` to be whole."""
        if deadline is None:
            ticket.idle = True
            try:
                async with asyncio.timeout(self._settings.idle_timeout_s):
                    if not await client.readable():
                        return None
            except TimeoutError:
                return None
            finally:
                ticket.idle = False
            deadline = asyncio.get_running_loop().time() + self._settings.head_timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                return await http1.read_request(client)
        except TimeoutError:
            self._metrics.refused.labels("head_timeout").inc()
            if client.buffered():
                why = "no whole request head in time"
                await self._refuse(client, Refused(408, "head_timeout", why))
            return None
        except EOFError:
            return None

    async def _one(
        self, client: ClientStream, link: Link, ticket: Ticket, deadline: float | None
    ) -> bool:
        """Serve one request; whether to read another on the connection."""
        try:
            head = await self._next_head(client, ticket, deadline)
        except http1.BadMessage as exc:
            await self._refuse(client, Refused(400, "bad_request", str(exc)))
            return False
        if head is None:
            return False
        started = time.monotonic()
        pub: Publication | None = None
        method, path, status = "", "", 0
        try:
            method, path = head.method, head.target.split("?", 1)[0][:512]
            target = access.route(head, head.target, self._settings.domain)
            if target is None:
                raise Refused(404, "not_a_preview", "not a preview address")
            if target.path_routed and path.rstrip("/").count("/") == 3 and not path.endswith("/"):
                query = head.target[len(path) :]
                raise Refused(308, "redirect", "", (f"Location: {path}/{query}",))
            creds, target = access.take_credentials(head, target)
            pub = await self._registry.get(target.session_id, target.port)
            verdict = access.check(self._signer, pub, target, creds)
            if isinstance(verdict, access.Refusal):
                raise Refused(verdict.status, verdict.why, verdict.message)
            assert pub is not None
            rebalanced = self._admission.rebalanced
            try:
                self._admission.admit(ticket, pub.tenant)
            except Full as full:
                self._metrics.refused.labels(full.why).inc()
                code = 429 if full.why == "tenant_full" else 503
                raise Refused(code, full.why, full.message) from None
            finally:
                if self._admission.rebalanced > rebalanced:
                    self._metrics.refused.labels("rebalanced").inc()
            framing = http1.request_framing(head)
            upgrade.check_request(head, framing)
            head.start = f"{head.method} {target.rest} {head.version}"
            cookie = ""
            if creds.from_query and verdict == creds.from_query:
                secure = self._tls is not None
                cookie = access.cookie_header(verdict, target, pub.expires_at, secure=secure)
            outcome = await self._relay(
                client, link, pub, head, framing, cookie, shared_origin=target.path_routed
            )
            status = outcome.status
            if not outcome.backend_reusable:
                await link.drop()
            return outcome.keep_alive and not outcome.upgraded
        except Refused as r:
            status = r.status
            await self._refuse(client, r)
            return False
        except OverLimit as exc:
            status = 429
            await self._refuse(client, Refused(429, "preview_quota", exc.what))
            return False
        except http1.BadMessage as exc:  # the request's own head or framing
            status = 400
            await self._refuse(client, Refused(400, "bad_request", str(exc)))
            return False
        except Broken:
            status = status or 502
            return False
        finally:
            self._record(pub, method, path, status, started)

    async def _relay(
        self,
        client: ClientStream,
        link: Link,
        pub: Publication,
        head: http1.Head,
        framing: http1.Framing,
        cookie: str,
        *,
        shared_origin: bool,
    ) -> Outcome:
        key = (pub.session_id, pub.port, pub.generation)
        reused = link.backend is not None and link.backend.key == key
        for attempt in (1, 2):
            backend = await self._backend(link, pub)
            meter = functools.partial(self._meter, backend.conn)
            try:
                return await exchange(
                    client,
                    backend.stream,
                    head,
                    head.method,
                    framing,
                    timeout_s=self._settings.timeout_s,
                    set_cookie=cookie,
                    meter=meter,
                    shared_origin=shared_origin,
                )
            except BadRequestBody as exc:
                await link.drop()
                raise Refused(400, "bad_request", str(exc)) from None
            except SandboxBroke as exc:
                await link.drop()
                raise Refused(502, "sandbox_protocol", f"the sandbox answered {exc}") from None
            except SandboxSilent:
                raise Refused(
                    504, "sandbox_timeout", "the sandbox did not answer in time"
                ) from None
            except SandboxGone as exc:
                await link.drop()
                if reused and attempt == 1 and framing == http1.NONE:
                    continue  # a kept-alive sandbox connection closed between requests
                what = "nothing listens on" if exc.why == "ECONNREFUSED" else "no answer from"
                raise Refused(502, "sandbox_closed", f"{what} port {pub.port}") from None
            except (http1.BadMessage, EOFError):
                raise Broken from None  # after the answer began: nothing more to say
            except BackendReset:
                client.abort()  # a reset is not an end: the client must not take it for one
                raise Broken from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _meter(self, conn: Connection, n: int, direction: str) -> None:
        self._metrics.bytes.labels(direction).inc(n)
        self._connections.count_bytes(conn, n)

    async def _backend(self, link: Link, pub: Publication) -> Backend:
        key = (pub.session_id, pub.port, pub.generation)
        if link.backend is not None and link.backend.key == key:
            return link.backend
        await link.drop()
        session = await self._store.get(pub.session_id)
        if (
            session is None
            or session.state is not SessionState.RUNNING
            or not session.container_id
            or session.lease_expires_at.timestamp() <= time.time()
        ):
            raise Refused(404, "session_not_running", "the session is not running")
        stack = AsyncExitStack()
        try:
            conn = stack.enter_context(self._connections.hold(*key))
            stream = await stack.enter_async_context(self._dialer.open(session, pub.port))
        except BaseException:
            await stack.aclose()
            raise
        link.backend = Backend(key, stream, conn, stack)
        return link.backend

    async def _refuse(self, client: ClientStream, r: Refused) -> None:
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            await client.write(_refusal(r))

    def _record(
        self, pub: Publication | None, method: str, path: str, status: int, started: float
    ) -> None:
        code = str(status or 0)
        self._metrics.requests.labels(code).inc()
        self._metrics.duration.observe(time.monotonic() - started)
        if pub is None:
            return  # no tenant to file it under: counted, not audited
        self._audit(
            AuditEvent.of(
                "preview",
                time=time.time(),
                tenant=pub.tenant,
                session_id=pub.session_id,
                port=pub.port,
                method=method,
                path=path,
                status=status,
            )
        )


def _refusal(r: Refused) -> bytes:
    body = (r.message + "\n").encode() if r.message else b""
    phrase = http.HTTPStatus(r.status).phrase
    lines = [
        f"HTTP/1.1 {r.status} {phrase}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
        "Connection: close",
        f"X-Sandboxd-Refusal: {r.why}",
        *r.headers,
        "",
        "",
    ]
    return "\r\n".join(lines).encode() + body
