"""A live session's network: its allowlist changed in place, its egress audit read back.

Apart from the lifecycle (sessions/lifecycle.py) because none of it makes or removes a sandbox:
it is the egress proxies' side of a session (sandboxd.egress), reached through the session's
lock and record.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

from sandboxd import domain_events, paging
from sandboxd.egress.audit import EgressEvent
from sandboxd.egress.manager import EgressManager
from sandboxd.errors import FailedPrecondition, InvalidArgument
from sandboxd.models import NetworkPolicy, Session
from sandboxd.reasons import Reason
from sandboxd.secrets.bindings import settle_secrets
from sandboxd.session_locks import SessionLocks
from sandboxd.sessions.spec import check_network
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)


class SessionNetwork:
    def __init__(
        self,
        store: SessionStore,
        locks: SessionLocks,
        egress: EgressManager | None,
        *,
        get: Callable[[str], Awaitable[Session]],
        require_running: Callable[[str], Awaitable[Session]],
        observer: domain_events.Observer,
    ) -> None:
        self._store = store
        self._locks = locks
        self._egress = egress  # None: ALLOWLIST sessions are refused (NETWORK_MODE_UNSUPPORTED)
        self._get = get
        self._require_running = require_running
        self._observer = observer

    def allowlist_check(self) -> Callable[[], None] | None:
        """What a policy asking for ALLOWLIST must pass (None: no egress proxies here)."""
        return self._allowlist if self._egress is not None else None

    def _allowlist(self) -> None:
        if self._egress is None:
            raise InvalidArgument(
                "network.mode ALLOWLIST is not available on this server; use DENY",
                reason=Reason.NETWORK_MODE_UNSUPPORTED,
            )
        self._egress.require_available()

    async def update(self, session_id: str, asked: NetworkPolicy) -> Session:
        """A live session's new allowlist: new proxy connections follow it, open tunnels stay."""
        network = check_network(asked, self.allowlist_check(), live=True)
        async with self._locks.locked(session_id):
            session = await self._require_running(session_id)
            if session.spec.network.mode is not network.mode:
                raise FailedPrecondition(
                    f"network.mode of session {session_id!r} is "
                    f"{session.spec.network.mode.value} and cannot change on a live session",
                    reason=Reason.NETWORK_MODE_FIXED,
                    metadata={"session_id": session_id},
                )
            network = settle_secrets(network, session.spec.network)
            session.spec = dataclasses.replace(session.spec, network=network)
            session.fingerprint = session.spec.fingerprint()
            await self._store.update_spec(session)
            if self._egress is not None:
                self._egress.update(session_id, network)
            log.info("network policy updated", extra={"session_id": session_id})
            self._observer.emit(
                domain_events.SessionActed(session.tenant, session_id, "update_network_policy")
            )
            return session

    async def egress_events(
        self, session_id: str, page_size: int, page_token: str
    ) -> tuple[list[EgressEvent], str]:
        """A page of the session's egress audit, oldest first; the token is the last seq."""
        await self._get(session_id)  # NOT_FOUND for unknown and other tenants' sessions
        size = paging.page_size(page_size)
        bound = f"egress {session_id}"
        after = int(paging.decode_token(page_token, str.isdigit, bound) or 0)
        audit = self._egress.audit(session_id) if self._egress is not None else None
        events = audit.events(after_seq=after, limit=size + 1) if audit is not None else []
        token = ""
        if len(events) > size:
            events = events[:size]
            token = paging.encode_token(str(events[-1].seq), bound)
        return events, token
