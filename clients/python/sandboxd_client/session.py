"""One session's calls: lifecycle and network here; processes (session_processes.py), files
(session_files.py, dir_watch.py), archives and snapshots (session_archives.py) in the mixins
`Session` is made of.

A `Session` is a handle (an id and the last `SessionInfo` seen); `async with session:` deletes
the session on exit, so a crashed caller's container goes away with it rather than at the end
of its lease.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from google.protobuf import field_mask_pb2

from sandboxd_client._convert import duration
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import UNSET, rpc
from sandboxd_client.dir_watch import DirWatching
from sandboxd_client.session_archives import ArchiveCalls
from sandboxd_client.session_files import FileCalls
from sandboxd_client.session_processes import ProcessCalls

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import session_pb2
else:  # loaded on first use (sandboxd_client._lazy)
    session_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.session_pb2")

if TYPE_CHECKING:
    from sandboxd_client import models
    from sandboxd_client.client import SandboxClient
    from sandboxd_client.models import EgressEvent, NetworkPolicy, SessionInfo
else:  # the result dataclasses, on first use (sandboxd_client._lazy)
    models = lazy("sandboxd_client.models")


class Session(ProcessCalls, FileCalls, ArchiveCalls, DirWatching):
    """One sandbox session. Its methods call the server; `info` is the last reply seen."""

    def __init__(
        self, client: SandboxClient, info: SessionInfo | None = None, *, session_id: str = ""
    ) -> None:
        self._client = client
        self._info = info
        self._session_id = info.session_id if info is not None else session_id

    @property
    def info(self) -> SessionInfo:
        """The last SessionInfo seen; a handle made from an id alone holds only the id (made
        when first read: `sandboxctl exec` never reads it, nor loads the result classes)."""
        if self._info is None:
            self._info = models.SessionInfo(session_id=self._session_id, state="UNSPECIFIED")
        return self._info

    @info.setter
    def info(self, value: SessionInfo) -> None:
        self._info = value

    @property
    def id(self) -> str:
        return self._session_id if self._info is None else self._info.session_id

    @property
    def state(self) -> str:
        """The state's short name: "RUNNING", "EXPIRED", ..."""
        return self.info.state

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.info.labels)

    @property
    def lease_expires_at(self) -> dt.datetime | None:
        return self.info.lease_expires_at

    def __repr__(self) -> str:
        return f"Session({self.id!r}, state={self.state})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.delete()

    @property
    def _stubs(self) -> Any:
        return self._client.stubs

    async def _session_call(self, method: str, call: Any, timeout: float | None) -> Self:
        resp = await self._client._unary(method, call, timeout)
        self.info = models.SessionInfo.from_pb(resp.session)
        return self

    # -- lifecycle --

    async def refresh(self, *, timeout: float | None = UNSET) -> Self:
        """Fetch the session's current state (GetSession)."""
        self.info = (await self._client.get_session(self.id, timeout=timeout)).info
        return self

    @rpc("SessionService/RenewLease")
    async def renew(self, ttl: float | None = None, *, timeout: float | None = UNSET) -> Self:
        """Extend the lease to `ttl` seconds from now (the server's default when None)."""
        req = session_pb2.RenewLeaseRequest(session_id=self.id, ttl=duration(ttl))
        return await self._session_call(
            "SessionService/RenewLease",
            lambda t: self._stubs.sessions.RenewLease(req, timeout=t),
            timeout,
        )

    @rpc("SessionService/DeleteSession")
    async def delete(self, *, timeout: float | None = UNSET) -> bool:
        """Remove the session and its container; deleting twice is not an error. True when
        this call removed it (false: it was gone already)."""
        req = session_pb2.DeleteSessionRequest(session_id=self.id)
        resp = await self._client._unary(
            "SessionService/DeleteSession",
            lambda t: self._stubs.sessions.DeleteSession(req, timeout=t),
            timeout,
        )
        return bool(resp.existed)

    @rpc("SessionService/SuspendSession")
    async def suspend(self, *, memory: bool = False, timeout: float | None = UNSET) -> Self:
        """Snapshot the workspace and stop the container; `resume` brings it back. `memory`:
        keep the processes and memory too (gVisor sessions where the server's features name
        `memory_suspend`; else `MEMORY_SUSPEND_UNSUPPORTED`, with nothing stopped)."""
        mode = session_pb2.SUSPEND_MODE_MEMORY if memory else session_pb2.SUSPEND_MODE_UNSPECIFIED
        req = session_pb2.SuspendSessionRequest(session_id=self.id, mode=mode)
        return await self._session_call(
            "SessionService/SuspendSession",
            lambda t: self._stubs.sessions.SuspendSession(req, timeout=t),
            timeout,
        )

    @rpc("SessionService/ResumeSession")
    async def resume(
        self, *, expected_fingerprint: str | None = None, timeout: float | None = UNSET
    ) -> Self:
        req = session_pb2.ResumeSessionRequest(
            session_id=self.id, expected_fingerprint=expected_fingerprint
        )
        return await self._session_call(
            "SessionService/ResumeSession",
            lambda t: self._stubs.sessions.ResumeSession(req, timeout=t),
            timeout,
        )

    @rpc("SessionService/UpdateNetworkPolicy")
    async def update_network_policy(
        self,
        network: NetworkPolicy,
        *,
        fields: Sequence[str] = (),
        timeout: float | None = UNSET,
    ) -> Self:
        """Replace the policy, or with `fields` (e.g. ["allowed_domains"]) only those fields of
        it (a field mask), the rest kept as they are."""
        req = session_pb2.UpdateNetworkPolicyRequest(
            session_id=self.id,
            network=network.to_pb(),
            update_mask=field_mask_pb2.FieldMask(paths=list(fields)) if fields else None,
        )
        return await self._session_call(
            "SessionService/UpdateNetworkPolicy",
            lambda t: self._stubs.sessions.UpdateNetworkPolicy(req, timeout=t),
            timeout,
        )

    @rpc("SessionService/ListEgressEvents")
    async def egress_events(
        self, *, page_size: int = 0, timeout: float | None = UNSET
    ) -> AsyncIterator[EgressEvent]:
        """The egress proxy's log of this session, oldest first, page by page."""

        async for resp in self._client._paged(
            "SessionService/ListEgressEvents",
            lambda token, t: self._stubs.sessions.ListEgressEvents(
                session_pb2.ListEgressEventsRequest(
                    session_id=self.id, page_size=page_size, page_token=token
                ),
                timeout=t,
            ),
            timeout,
        ):
            for event in resp.events:
                yield models.EgressEvent.from_pb(event)
