"""The built-in egress proxy of one session: CONNECT and absolute-form plain HTTP (asyncio).

Order of checks for every request: quotas, a strict head parse, the declared name and port,
one lookup (static map first, then the resolver's own threads), every answer address checked
(one refused address refuses the whole answer; the host's own addresses, cloud metadata and
loopback whatever the grant), then a dial of exactly a checked address, checked again. A refused
request gets one HTTP error reply and the connection is closed. Every decision goes to the
session's audit log with the bytes moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from sandboxd.egress import addresses
from sandboxd.egress.addresses import IPAddress, Protected
from sandboxd.egress.audit import AuditLog
from sandboxd.egress.policy import ResolvedQuotas
from sandboxd.egress.replies import CHUNK, linger_close, reply, request_line_words
from sandboxd.egress.resolver import Resolver, ResolverBusy
from sandboxd.secrets import inject, mitm
from sandboxd.secrets.interceptor import Interceptor
from sandboxd.targets import (
    MAX_HEAD_BYTES,
    RequestKind,
    TargetError,
    name_allowed,
    parse_request_head,
)

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
MAX_LINGERING = 64
READ_LIMIT = MAX_HEAD_BYTES  # of a connection's StreamReader: a longer head is refused


@dataclass(frozen=True)
class Rules:
    """The live allowlist of a proxy (replaced whole by UpdateNetworkPolicy)."""

    domains: tuple[str, ...]
    ports: frozenset[int]
    allow_private_networks: bool


class Refused(Exception):
    """A request the proxy refuses; becomes one HTTP reply and an audit event."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.method, self.host, self.port, self.address = "", "", 0, ""

    def about(self, method: str, host: str, port: int, address: str = "") -> Refused:
        """What the audit names: set once the head was parsed."""
        self.method, self.host, self.port, self.address = method, host, port, address
        return self


@dataclass(frozen=True)
class _Decision:
    """An allowed request: where to, the checked addresses, and (plain HTTP) what to send."""

    method: str
    host: str
    port: int
    addresses: tuple[str, ...]
    upstream_head: bytes  # empty for CONNECT
    body: int  # plain-HTTP request body bytes to copy after the head


class _Budget:
    """Bytes each way for the whole proxy; a tunnel that exhausts it is cut."""

    def __init__(self, up: int, down: int) -> None:
        self.limit = {"up": up, "down": down}
        self.used = {"up": 0, "down": 0}

    def left(self, direction: str) -> int:
        return self.limit[direction] - self.used[direction]


class _QuotaCut(Exception):
    pass


class EgressProxy:
    """One session's proxy; owned by the EgressManager, closed with the session. It has no
    listener: the session's connections are handed to `accept`."""

    read_limit = READ_LIMIT

    def __init__(
        self,
        session_id: str,
        rules: Rules,
        quotas: ResolvedQuotas,
        resolver: Resolver,
        audit: AuditLog,
        protected: Protected | None = None,
        interceptor: Interceptor | None = None,
        tenant: str = "",
    ) -> None:
        self.session_id = session_id
        # The resolver's threads are shared by every proxy: its per-owner share is the
        # tenant's, so a tenant's many sessions together hold no more than one share.
        self._lookup_owner = f"tenant:{tenant}" if tenant else f"session:{session_id}"
        self.interceptor = interceptor  # secrets: TLS terminated for their bound hosts
        self.rules = rules
        self.quotas = quotas
        self.audit = audit
        self._resolver = resolver
        self._protected = protected or Protected()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing: set[asyncio.Task[None]] = set()  # refused over quota, lingering
        self._dns_in_flight = 0
        self.requests = 0
        self.budget = _Budget(quotas.max_bytes_up, quotas.max_bytes_down)
        self._closed = False

    @property
    def active(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        """Cut every open connection; connections handed in later are closed at once."""
        self._closed = True
        tasks = self._tasks | self._closing
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one connection of this session's sandbox (an `egress` stream of its agent's
        channel, already known to be the session's: no address to check). Never blocks: the
        connection gets a task of its own, owned by the proxy. `reader` should have a limit
        of `READ_LIMIT` (a longer head is HEAD_TOO_LARGE)."""
        if self._closed:
            writer.close()
            return
        # Over the connection quota: refuse here, before a task exists; tunnels keep running.
        if len(self._tasks) >= self.quotas.max_connections:
            self.audit.record(method="", host="", port=0, allowed=False, reason="QUOTA_CONNECTIONS")
            reply(writer, 429, "QUOTA_CONNECTIONS", "too many concurrent connections")
            if len(self._closing) >= MAX_LINGERING:
                writer.close()  # a flood: no lingering, the reply may be lost to a reset
                return
            closing = asyncio.create_task(linger_close(reader, writer))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            return
        task = asyncio.create_task(self._handle(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            try:
                decision = await self._decide(reader)
                up_reader, upstream, address = await self._dial(decision)
                relay = await self._secrets(decision, upstream)
            except Refused as exc:
                self.audit.record(
                    method=exc.method,
                    host=exc.host,
                    port=exc.port,
                    allowed=False,
                    reason=exc.reason,
                    address=exc.address,
                )
                reply(writer, exc.status, exc.reason, str(exc))
                await linger_close(reader, writer)
                return
            await self._carry(decision, address, reader, writer, up_reader, upstream, relay)
        except (ConnectionError, OSError):
            pass
        finally:
            for w in (upstream, writer):
                if w is not None:
                    w.close()

    async def _carry(
        self,
        decision: _Decision,
        address: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        relay: mitm.HttpRelay | None = None,
    ) -> None:
        """Move the bytes of an allowed request; one audit event with the totals at the end."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        counts = {"up": 0, "down": 0}
        ended = "closed"
        try:
            if decision.upstream_head:
                await self._send(upstream, decision.upstream_head, "up", counts)
                await self._copy_exact(reader, upstream, decision.body, counts)
            else:
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                await writer.drain()
            if relay is not None and self.interceptor is not None:
                relay.bind_counts(counts)
                tls = await relay.terminate(
                    writer, self.interceptor.ca, self.quotas.header_timeout_s
                )
                try:
                    async with asyncio.timeout(self.quotas.tunnel_lifetime_s):
                        await relay.run(*tls, up_reader, upstream)
                finally:
                    tls[1].close()
                return
            ended = await self._relay(
                reader, writer, up_reader, upstream, counts, both=not decision.upstream_head
            )
        except _QuotaCut:
            ended = "byte_quota"
        except TimeoutError:
            lived = loop.time() - started >= self.quotas.tunnel_lifetime_s
            ended = "lifetime" if lived else "idle_timeout"
        except (ConnectionError, OSError, inject.HeadError):
            ended = "reset"
        except asyncio.CancelledError:
            ended = "proxy_closed"
            raise
        finally:
            self.audit.record(
                method=decision.method,
                host=decision.host,
                port=decision.port,
                allowed=True,
                address=address,
                bytes_up=counts["up"],
                bytes_down=counts["down"],
                duration_s=loop.time() - started,
                ended=ended,
            )

    async def _secrets(self, d: _Decision, upstream: asyncio.StreamWriter) -> mitm.HttpRelay | None:
        """A placeholder in a plain request (never given a value) is audited, and refused if
        the policy says so; a CONNECT to a bound host gets the intercepting relay, upstream
        TLS verified first. None: a plain tunnel or request, untouched."""
        if self.interceptor is None:
            return None

        def record(kind: str, method: str, name: str) -> None:
            self.audit.record(
                method=method or d.method, host=d.host, port=d.port, allowed=True, kind=kind,
                secret=name,
            )  # fmt: skip

        try:
            if d.upstream_head:
                self.interceptor.check_plain(d.host, d.upstream_head, record)
                return None
            idle = self.quotas.idle_timeout_s
            return await self.interceptor.relay(d.host, upstream, record, self._send, idle)
        except mitm.Refusal as exc:
            raise Refused(exc.status, exc.reason, str(exc)).about(
                d.method, d.host, d.port
            ) from None

    async def _decide(self, reader: asyncio.StreamReader) -> _Decision:
        """Read and judge one request, up to the checked addresses; Refused otherwise."""
        if self.requests >= self.quotas.max_requests:
            raise Refused(429, "QUOTA_REQUESTS", "request quota of this session is used up")
        self.requests += 1
        try:
            async with asyncio.timeout(self.quotas.header_timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            raise Refused(408, "HEADER_TIMEOUT", "request head not received in time") from None
        except asyncio.LimitOverrunError:
            raise Refused(431, "HEAD_TOO_LARGE", "request head too large") from None
        except asyncio.IncompleteReadError:
            raise Refused(400, "MALFORMED_REQUEST", "connection closed mid-head") from None
        try:
            req = parse_request_head(head)
        except TargetError as exc:
            method, target = request_line_words(head)
            raise Refused(exc.status, exc.reason, str(exc)).about(method, target, 0) from None
        rules = self.rules

        def refuse(status: int, reason: str, message: str, address: str = "") -> Refused:
            return Refused(status, reason, message).about(req.method, req.host, req.port, address)

        if not name_allowed(req.host, rules.domains):
            raise refuse(403, "NAME_NOT_ALLOWED", f"{req.host} is not an allowed domain")
        if req.port not in rules.ports:
            raise refuse(403, "PORT_NOT_ALLOWED", f"port {req.port} is not allowed")
        if self.budget.left("up") <= 0 or self.budget.left("down") <= 0:
            raise refuse(429, "QUOTA_BYTES", "byte quota of this session is used up")
        if self._dns_in_flight >= self.quotas.max_dns_lookups:
            raise refuse(429, "QUOTA_DNS", "too many name lookups in flight")
        self._dns_in_flight += 1
        try:
            answers = await self._resolver.resolve(req.host, req.port, owner=self._lookup_owner)
        except ResolverBusy as exc:
            raise refuse(429, "QUOTA_DNS", f"name lookups are busy: {exc}") from None
        except (OSError, TimeoutError, UnicodeError):
            raise refuse(502, "DNS_FAILED", f"{req.host} does not resolve") from None
        finally:
            self._dns_in_flight -= 1
        if not answers:
            raise refuse(502, "DNS_FAILED", f"{req.host} has no address")
        checked: list[IPAddress] = []
        for text in answers:
            try:
                addr = addresses.parse_answer(text)
            except ValueError:
                raise refuse(502, "DNS_FAILED", "unparsable answer") from None
            verdict = self._check(addr, rules.allow_private_networks)
            if not verdict.allowed:
                raise refuse(
                    403, "ADDRESS_REFUSED", f"{req.host} resolves to a refused address", str(addr)
                )
            checked.append(addr)
        return _Decision(
            method=req.method,
            host=req.host,
            port=req.port,
            addresses=tuple(str(a) for a in checked),
            upstream_head=req.upstream_head if req.kind is RequestKind.HTTP else b"",
            body=req.content_length if req.kind is RequestKind.HTTP else 0,
        )

    def _check(self, addr: IPAddress, allow_private_networks: bool) -> addresses.Verdict:
        return addresses.check(
            addr, allow_private_networks=allow_private_networks, protected=self._protected
        )

    async def _dial(
        self, decision: _Decision
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str]:
        """Connect to the checked addresses in answer order; never to the name again, so DNS
        rebinding cannot swap what was checked. Each is checked once more just before its
        connect, against the rules and host addresses of that moment."""
        for address in decision.addresses:
            verdict = self._check(
                addresses.parse_answer(address), self.rules.allow_private_networks
            )
            if not verdict.allowed:
                raise Refused(
                    403, "ADDRESS_REFUSED", f"{decision.host} resolves to a refused address"
                ).about(decision.method, decision.host, decision.port, address)
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    r, w = await asyncio.open_connection(address, decision.port, limit=CHUNK)
            except (OSError, TimeoutError):
                continue
            return r, w, address
        raise Refused(502, "UPSTREAM_UNREACHABLE", f"{decision.host} did not answer").about(
            decision.method, decision.host, decision.port, ",".join(decision.addresses)[:300]
        )

    async def _send(
        self,
        w: asyncio.StreamWriter,
        data: bytes,
        direction: str,
        counts: dict[str, int],
        *,
        bounded: bool = True,
    ) -> None:
        """Write within the byte budget; `bounded`: the drain has its own idle timeout (the
        relay's pumps have none: its watchdog cancels them)."""
        left = self.budget.left(direction)
        cut = len(data) > left
        data = data[: max(left, 0)]
        self.budget.used[direction] += len(data)
        counts[direction] += len(data)
        if data:
            w.write(data)
            if not bounded:
                await w.drain()
            else:
                # A peer that stops reading holds a connection slot at most an idle timeout.
                # (asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation.)
                async with asyncio.timeout(self.quotas.idle_timeout_s):
                    await w.drain()
        if cut:
            raise _QuotaCut()

    async def _copy_exact(
        self,
        r: asyncio.StreamReader,
        w: asyncio.StreamWriter,
        length: int,
        counts: dict[str, int],
    ) -> None:
        while length > 0:
            async with asyncio.timeout(self.quotas.idle_timeout_s):
                chunk = await r.read(min(CHUNK, length))
            if not chunk:
                return
            length -= len(chunk)
            await self._send(w, chunk, "up", counts)

    async def _relay(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
        counts: dict[str, int],
        *,
        both: bool,
    ) -> str:
        """Copy until both directions end (plain HTTP: until the response ends)."""
        loop = asyncio.get_running_loop()
        last = [loop.time()]

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter, direction: str) -> None:
            while chunk := await r.read(CHUNK):
                last[0] = loop.time()
                await self._send(w, chunk, direction, counts, bounded=False)
            if w.can_write_eof():
                with contextlib.suppress(OSError):
                    w.write_eof()

        tasks = {asyncio.create_task(pump(up_r, client_w, "down"))}
        if both:
            tasks.add(asyncio.create_task(pump(client_r, up_w, "up")))
        deadline = loop.time() + self.quotas.tunnel_lifetime_s
        try:
            pending = set(tasks)
            while pending:
                now = loop.time()
                timeout = min(deadline, last[0] + self.quotas.idle_timeout_s) - now
                if timeout <= 0:
                    return "lifetime" if now >= deadline else "idle_timeout"
                done, pending = await asyncio.wait(
                    pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                for t in done:
                    t.result()  # re-raise _QuotaCut or a socket error
            return "closed"
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
