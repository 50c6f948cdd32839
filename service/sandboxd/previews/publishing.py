"""The domain behind SessionService.PublishPort, UnpublishPort and ListPorts.

A publication is checked against the caller's own session (another tenant's answers like a
missing one, `SessionManager.get`), the port range, the token's lifetime, the operator's
`preview_public` grant and the per-session port cap; it is recorded in the registry and
answered with the preview's two URLs and a fresh token. Publishing a port again revokes its
older tokens and cuts the connections they opened; UnpublishPort does both and removes it.
`end_session` is a session-end hook (delete, suspend, expiry, a lost sandbox).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sandboxd import domain_events, paging, tenancy, validation
from sandboxd.config_sections.previews import PreviewsSection
from sandboxd.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from sandboxd.models import SessionState
from sandboxd.previews.connections import OpenConnections
from sandboxd.previews.registry import PortRegistry, Publication
from sandboxd.previews.tokens import Claims, TokenSigner
from sandboxd.reasons import Reason
from sandboxd.sessions import SessionManager

DEFAULT_TTL_S = 3600.0
RUNNING = SessionState.RUNNING


@dataclass(frozen=True)
class Preview:
    port: int
    url: str
    path_url: str
    token: str
    expires_at: float
    public: bool


@dataclass
class Address:
    """Where the listener is reachable: set once it is bound (its port may be chosen then)."""

    scheme: str = "http"
    host: str = ""
    port: int = 0


class Previews:
    def __init__(
        self,
        settings: PreviewsSection,
        sessions: SessionManager,
        registry: PortRegistry,
        signer: TokenSigner,
        connections: OpenConnections,
        address: Address,
        observer: domain_events.Observer = domain_events.SILENT,  # ports published, withdrawn
    ) -> None:
        self._observer = observer
        self._settings = settings
        self._sessions = sessions
        self._registry = registry
        self._signer = signer
        self._connections = connections
        self._address = address

    def _enabled(self) -> None:
        if not self._settings.listen or not self._address.port:
            raise FailedPrecondition(
                "this server serves no previews (the operator sets preview_listen)",
                reason=Reason.PREVIEWS_DISABLED,
            )

    @staticmethod
    def _port(port: int) -> int:
        if not 1 <= port <= 65535:
            raise InvalidArgument(
                f"port {port} is not 1-65535",
                reason=Reason.PREVIEW_PORT_INVALID,
                metadata={"port": str(port)},
            )
        return port

    def _ttl(self, ttl_s: float | None) -> float:
        return validation.positive_duration(
            DEFAULT_TTL_S if ttl_s is None else ttl_s,
            name="ttl",
            maximum=self._settings.max_ttl_s,
            reason=Reason.PREVIEW_TTL_INVALID,
            metadata={"max_ttl_s": f"{self._settings.max_ttl_s:g}"},
            over_reason=Reason.PREVIEW_TTL_INVALID,  # the reason this field has always had
        )

    async def publish(
        self, session_id: str, port: int, ttl_s: float | None, public: bool
    ) -> Preview:
        # The request's own faults first (INVALID_ARGUMENT whatever the server serves), then
        # whether this server serves previews at all.
        self._port(port)
        ttl = self._ttl(ttl_s)
        self._enabled()
        if public and not tenancy.current_grants().preview_public:
            raise PermissionDenied(
                "a public preview needs the operator's preview_public grant for this tenant",
                reason=Reason.PREVIEW_PUBLIC_NOT_ALLOWED,
            )
        session = await self._sessions.require_running(session_id)  # a suspended one resumes
        async with self._sessions.locked(session_id):
            current = await self._sessions.get(session_id)
            if current.created_at != session.created_at or current.state is not RUNNING:
                raise FailedPrecondition(
                    f"session {session_id!r} stopped while the port was being published",
                    reason=Reason.SESSION_NOT_RUNNING,
                )
            published = await self._registry.of_session(session_id)
            again = any(p.port == port for p in published)
            if not again and len(published) >= self._settings.max_ports:
                raise ResourceExhausted(
                    f"the session already publishes {len(published)} ports, the most it may",
                    reason=Reason.PREVIEW_PORTS_QUOTA,
                    metadata={"quota": str(self._settings.max_ports)},
                )
            pub = await self._registry.publish(
                session_id, port, session.tenant, public, time.time() + ttl
            )
        self._connections.cut(session_id, port, keep_generation=pub.generation)
        self._observer.emit(
            domain_events.PortPublished(session.tenant, session_id, port, public, pub.expires_at)
        )
        return self._preview(pub, with_token=True)

    async def unpublish(self, session_id: str, port: int) -> None:
        self._port(port)
        await self._sessions.get(session_id)  # the caller's own session, or NOT_FOUND
        if not await self._registry.remove(session_id, port):
            raise NotFound(
                f"port {port} of session {session_id!r} is not published",
                reason=Reason.PORT_NOT_PUBLISHED,
                metadata={"session_id": session_id, "port": str(port)},
            )
        self._connections.cut(session_id, port)
        self._observer.emit(domain_events.PortUnpublished(tenancy.current(), session_id, port))

    async def list_ports(
        self, session_id: str, page_size: int, page_token: str
    ) -> tuple[list[Preview], str]:
        await self._sessions.get(session_id)
        pubs = await self._registry.of_session(session_id)
        page, token = paging.page(
            pubs,
            lambda p: f"{p.port:05d}",
            paging.page_size(page_size),
            page_token,
            f"ports {session_id!r}",
        )
        return [self._preview(p, with_token=False) for p in page], token

    def _preview(self, pub: Publication, *, with_token: bool) -> Preview:
        token = ""
        if with_token and not pub.public:
            claims = Claims(pub.session_id, pub.port, pub.tenant, pub.generation, pub.expires_at)
            token = self._signer.sign(claims)
        a = self._address
        default_port = {"http": 80, "https": 443}[a.scheme]
        suffix = "" if a.port == default_port else f":{a.port}"
        url = ""
        if self._settings.domain:
            host = f"{pub.port}-{pub.session_id}.{self._settings.domain}"
            url = f"{a.scheme}://{host}{suffix}/"
        host = self._settings.domain or a.host
        path_url = f"{a.scheme}://{host}{suffix}/preview/{pub.session_id}/{pub.port}/"
        return Preview(pub.port, url, path_url, token, pub.expires_at, pub.public)
