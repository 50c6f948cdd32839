"""An asyncio client for sandboxd over its own generated stubs.

    async with SandboxClient("127.0.0.1:50051") as client:
        async with await client.create_session(allow=["echo"]) as session:
            result = await session.run(["echo", "hi"])

The client owns one channel (opened by `async with`, closed on exit). On first use it asks
the server for its API version (GetServerInfo) and refuses a server it cannot speak to with
`errors.IncompatibleServer` / `errors.NotSandboxd`. Every failed call is raised as a
`sandboxd_client.errors.SandboxError` subclass, never as a raw `grpc.RpcError`.

Deadlines: `timeout` (seconds) on the client is the default deadline of each unary call; every
method takes `timeout=` to override it. Streams run without one unless given. Cancelling the
awaiting task cancels the call on the server.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandboxd_client import _channel
from sandboxd_client._connection import API_VERSION, Connection, _State, check_api_version
from sandboxd_client._convert import duration, enum_value
from sandboxd_client._gen.sandboxd.v1 import admin_pb2  # every first call
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import UNSET, RetryPolicy, rpc
from sandboxd_client.audit import AuditMixin
from sandboxd_client.images import ImagesMixin, pull_policy_pb
from sandboxd_client.previews import PreviewsMixin
from sandboxd_client.session import Session
from sandboxd_client.snapshots import SnapshotsMixin
from sandboxd_client.templates import TemplatesMixin
from sandboxd_client.volumes import VolumeMount, VolumesMixin
from sandboxd_client.watch import WatchMixin

# The other services' generated modules load on first use: `sandboxctl exec` needs only the
# process service's (tests/clients/test_client_cli_imports.py checks what it loads).
if TYPE_CHECKING:
    from sandboxd_client import models
    from sandboxd_client._gen.sandboxd.v1 import common_pb2, leases_pb2, session_pb2
    from sandboxd_client.models import NetworkPolicy, ResourceLimits, ServerInfo, SweepResult
else:
    models = lazy("sandboxd_client.models")  # the result dataclasses
    _V1 = "sandboxd_client._gen.sandboxd.v1."
    common_pb2 = lazy(_V1 + "common_pb2")
    leases_pb2 = lazy(_V1 + "leases_pb2")
    session_pb2 = lazy(_V1 + "session_pb2")

DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_RETRY = RetryPolicy()
TLS = _channel.TLS


class SandboxClient(
    Connection,
    AuditMixin,
    WatchMixin,
    ImagesMixin,
    TemplatesMixin,
    PreviewsMixin,
    VolumesMixin,
    SnapshotsMixin,
):
    """A connection to one sandboxd server; use as `async with SandboxClient(addr) as c`.

    `address` unset is $SANDBOXD_ADDR (else 127.0.0.1:50051). `token` (unset:
    $SANDBOXD_TOKEN) is sent as a bearer token on every call. `timeout` is the default deadline in
    seconds of unary calls; `connect_timeout` bounds the first-use version check when the
    call has no deadline of its own. `retry` is the retry policy of idempotent calls (None:
    no retries at all).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        token: str | None = None,
        tls: _channel.TLS | None = None,
        timeout: float | None = None,
        connect_timeout: float = 10.0,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        # As sandboxctl: unset, the address is $SANDBOXD_ADDR (else 127.0.0.1:50051) and the
        # token $SANDBOXD_TOKEN, so a script or notebook needs no configuration code.
        self.address = address or os.environ.get("SANDBOXD_ADDR") or DEFAULT_ADDRESS
        if token is None:
            token = os.environ.get("SANDBOXD_TOKEN") or None
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retry = retry
        self._token, self._tls, self._options = token, tls, list(options)
        self._state = _State.UNOPENED
        self._channel = None
        self._stubs = None
        # The first-use check's answer, and its ServerInfo once asked for: a call that only
        # needs the check (sandboxctl exec) never loads the result classes.
        self._server_pb = None
        self._server = None
        self._check_lock = asyncio.Lock()

    # -- sessions --

    @rpc("SessionService/CreateSession")
    async def create_session(
        self,
        *,
        session_id: str = "",
        allow: Sequence[str] = (),
        allow_all: bool = False,
        files: Mapping[str, bytes] | None = None,
        directories: Sequence[str] = (),
        workspace_id: str = "",
        image: str = "",
        limits: ResourceLimits | None = None,
        network: NetworkPolicy | None = None,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        lease_ttl: float | None = None,
        user: str = "",
        from_snapshot_id: str = "",
        on_expiry: str = "",
        renew_on_activity: bool = False,
        isolation: str = "",
        template: str = "",
        pull_policy: str = "",
        volumes: Sequence[VolumeMount] = (),
        timeout: float | None = UNSET,
    ) -> Session:
        """Create a session. Every command is denied unless named in `allow` or `allow_all`.

        `isolation` is "runc" or "gvisor" (empty: the server's default; `server_info()` lists
        the tiers on offer); a tier the server cannot give is refused, never replaced.
        `template` names a template ("python", "busybox") instead of an `image`.
        `volumes` mounts the caller's volumes (VolumeService) below /mnt.

        With a caller-chosen `session_id` the call is idempotent (the same request returns
        the same session), so it is retried on transient errors; without one it never is.
        """
        request = session_pb2.CreateSessionRequest(
            session_id=session_id,
            workspace=session_pb2.WorkspaceManifest(
                id=workspace_id,
                files=[
                    session_pb2.ManifestFile(path=p, content=c) for p, c in (files or {}).items()
                ],
                directories=list(directories),
            ),
            image=image,
            limits=limits.to_pb() if limits else None,
            network=network.to_pb() if network else None,
            shell=common_pb2.ShellPolicy(allow=list(allow), allow_all=allow_all),
            env=dict(env or {}),
            labels=dict(labels or {}),
            lease_ttl=duration(lease_ttl),
            user=user,
            from_snapshot_id=from_snapshot_id,
            on_expiry=enum_value(leases_pb2.ExpiryAction, on_expiry, "EXPIRY_ACTION_"),
            renew_on_activity=renew_on_activity,
            isolation=common_pb2.Isolation.Value("ISOLATION_" + isolation.upper())
            if isolation
            else common_pb2.ISOLATION_UNSPECIFIED,
            template=template,
            pull_policy=pull_policy_pb(pull_policy),
            volumes=[v.to_pb() for v in volumes],
        )
        resp = await self._unary(
            "SessionService/CreateSession",
            lambda t: self.stubs.sessions.CreateSession(request, timeout=t),
            timeout,
            idempotent=bool(session_id),
        )
        return Session(self, models.SessionInfo.from_pb(resp.session))

    @rpc("SessionService/GetSession")
    async def get_session(self, session_id: str, *, timeout: float | None = UNSET) -> Session:
        req = session_pb2.GetSessionRequest(session_id=session_id)
        resp = await self._unary(
            "SessionService/GetSession",
            lambda t: self.stubs.sessions.GetSession(req, timeout=t),
            timeout,
        )
        return Session(self, models.SessionInfo.from_pb(resp.session))

    def session(self, session_id: str) -> Session:
        """A handle on an existing session, without a call (its `info` holds only the id)."""
        return Session(self, session_id=session_id)

    @rpc("SessionService/ListSessions")
    async def list_sessions(
        self,
        labels: Mapping[str, str] | None = None,
        *,
        state: str = "",
        page_size: int = 0,
        timeout: float | None = UNSET,
    ) -> AsyncIterator[Session]:
        """Every session carrying all of `labels` (and in `state`, e.g. "RUNNING", if given),
        following pages as the loop goes."""

        selector = dict(labels or {})
        state_pb = enum_value(session_pb2.SessionState, state, "SESSION_STATE_")
        async for resp in self._paged(
            "SessionService/ListSessions",
            lambda token, t: self.stubs.sessions.ListSessions(
                session_pb2.ListSessionsRequest(
                    label_selector=selector,
                    page_size=page_size,
                    page_token=token,
                    state=state_pb,
                ),
                timeout=t,
            ),
            timeout,
        ):
            for info in resp.sessions:
                yield Session(self, models.SessionInfo.from_pb(info))

    # -- the server --

    @rpc("AdminService/GetServerInfo")
    async def server_info(self, *, timeout: float | None = UNSET) -> ServerInfo:
        """The server's version, features and limits (the first call is the version check)."""
        if self._server_pb is None:
            return await self.ensure_compatible(self._deadline(timeout))
        req = admin_pb2.GetServerInfoRequest()
        resp = await self._unary(
            "AdminService/GetServerInfo",
            lambda t: self.stubs.admin.GetServerInfo(req, timeout=t),
            timeout,
        )
        info = models.ServerInfo.from_pb(resp)
        self._server = info
        return info

    @rpc("AdminService/Sweep")
    async def sweep(self, *, timeout: float | None = UNSET) -> SweepResult:
        """Expire ended leases and remove containers no session claims (admin)."""
        req = admin_pb2.SweepRequest()
        resp = await self._unary(
            "AdminService/Sweep", lambda t: self.stubs.admin.Sweep(req, timeout=t), timeout
        )
        return models.SweepResult.from_pb(resp)


__all__ = ["API_VERSION", "DEFAULT_ADDRESS", "TLS", "SandboxClient", "check_api_version"]
