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
import enum
import functools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import grpc

from sandboxd_client import _channel
from sandboxd_client._call_end import CallEnd
from sandboxd_client._convert import duration, enum_value
from sandboxd_client._gen.sandboxd.v1 import admin_pb2, admin_pb2_grpc  # every first call
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import IDEMPOTENT, PACKAGE, UNSET, RetryPolicy, rpc
from sandboxd_client.audit import AuditMixin
from sandboxd_client.errors import (
    DeadlineExceeded,
    EngineUnavailable,
    IncompatibleServer,
    SandboxError,
    from_rpc_error,
)
from sandboxd_client.images import ImagesMixin, pull_policy_pb
from sandboxd_client.previews import PreviewsMixin
from sandboxd_client.session import Session
from sandboxd_client.templates import TemplatesMixin
from sandboxd_client.volumes import VolumeMount, VolumesMixin
from sandboxd_client.watch import WatchMixin

# The other services' generated modules load on first use: `sandboxctl exec` needs only the
# process service's (tests/clients/test_client_cli_imports.py checks what it loads).
if TYPE_CHECKING:
    from sandboxd_client import models
    from sandboxd_client._gen.sandboxd.v1 import (
        common_pb2,
        filesystem_pb2_grpc,
        leases_pb2,
        process_pb2_grpc,
        session_pb2,
        session_pb2_grpc,
        snapshot_pb2,
        snapshot_pb2_grpc,
    )
    from sandboxd_client.models import (
        NetworkPolicy,
        ResourceLimits,
        ServerInfo,
        SnapshotInfo,
        SweepResult,
    )
else:
    models = lazy("sandboxd_client.models")  # the result dataclasses
    _V1 = "sandboxd_client._gen.sandboxd.v1."
    common_pb2 = lazy(_V1 + "common_pb2")
    filesystem_pb2_grpc = lazy(_V1 + "filesystem_pb2_grpc")
    leases_pb2 = lazy(_V1 + "leases_pb2")
    process_pb2_grpc = lazy(_V1 + "process_pb2_grpc")
    session_pb2 = lazy(_V1 + "session_pb2")
    session_pb2_grpc = lazy(_V1 + "session_pb2_grpc")
    snapshot_pb2 = lazy(_V1 + "snapshot_pb2")
    snapshot_pb2_grpc = lazy(_V1 + "snapshot_pb2_grpc")

DEFAULT_ADDRESS = "127.0.0.1:50051"
API_VERSION = "v1"
DEFAULT_RETRY = RetryPolicy()
TLS = _channel.TLS

T = TypeVar("T")


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPENED = "opened"
    CLOSED = "closed"


class _Stubs:
    """The channel's stubs, each made (and its service's module imported) on first use."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel

    @functools.cached_property
    def sessions(self) -> session_pb2_grpc.SessionServiceStub:
        return session_pb2_grpc.SessionServiceStub(self._channel)

    @functools.cached_property
    def processes(self) -> process_pb2_grpc.ProcessServiceStub:
        return process_pb2_grpc.ProcessServiceStub(self._channel)

    @functools.cached_property
    def files(self) -> filesystem_pb2_grpc.FilesystemServiceStub:
        return filesystem_pb2_grpc.FilesystemServiceStub(self._channel)

    @functools.cached_property
    def snapshots(self) -> snapshot_pb2_grpc.SnapshotServiceStub:
        return snapshot_pb2_grpc.SnapshotServiceStub(self._channel)

    @functools.cached_property
    def admin(self) -> admin_pb2_grpc.AdminServiceStub:
        return admin_pb2_grpc.AdminServiceStub(self._channel)


def check_api_version(info: ServerInfo | admin_pb2.GetServerInfoResponse, address: str) -> None:
    """Refuse a server of another major API version (an empty one predates the field: v1)."""
    major = (info.api_version or API_VERSION).split(".")[0]
    if major != API_VERSION:
        raise IncompatibleServer(
            f"the server at {address} speaks sandboxd API {info.api_version!r}; this client "
            f"speaks {API_VERSION}: install a sandboxd-client for {major}",
            reason="INCOMPATIBLE_API_VERSION",
            metadata={"api_version": info.api_version, "client_api_version": API_VERSION},
            retryable=False,
        )


class SandboxClient(
    AuditMixin, WatchMixin, ImagesMixin, TemplatesMixin, PreviewsMixin, VolumesMixin
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
        self._channel: grpc.aio.Channel | None = None
        self._stubs: _Stubs | None = None
        # The first-use check's answer, and its ServerInfo once asked for: a call that only
        # needs the check (sandboxctl exec) never loads the result classes.
        self._server_pb: admin_pb2.GetServerInfoResponse | None = None
        self._server: ServerInfo | None = None
        self._check_lock = asyncio.Lock()

    # -- lifecycle --

    async def __aenter__(self) -> Self:
        self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def open(self) -> None:
        """Create the channel (connections are made lazily, on the first call)."""
        if self._state is not _State.UNOPENED:
            raise RuntimeError(f"client is {self._state.value}; create a new one")
        self._channel = _channel.open_channel(
            self.address, self._token, self._tls, self.retry, self._options
        )
        self._stubs = _Stubs(self._channel)
        self._state = _State.OPENED

    async def close(self) -> None:
        if self._channel is not None and self._state is _State.OPENED:
            await self._channel.close()
        self._state = _State.CLOSED

    @property
    def channel(self) -> grpc.aio.Channel:
        """The underlying channel (for interceptors or services added after this client)."""
        if self._channel is None or self._state is not _State.OPENED:
            raise RuntimeError(f"client is {self._state.value}; use `async with SandboxClient()`")
        return self._channel

    @property
    def stubs(self) -> _Stubs:
        _ = self.channel
        assert self._stubs is not None
        return self._stubs

    # -- the call machinery --

    def _deadline(self, timeout: float | None) -> float | None:
        t = self.timeout if timeout is UNSET else timeout
        return None if t is None else time.monotonic() + t

    @staticmethod
    def _remaining(deadline: float | None) -> float | None:
        if deadline is None:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded("the deadline ran out", reason="DEADLINE_EXCEEDED")
        return left

    async def ensure_compatible(self, deadline: float | None = None) -> ServerInfo:
        """Check the server's API version once (the first call does it implicitly)."""
        if self._server is None:
            self._server = models.ServerInfo.from_pb(await self._checked(deadline))
        return self._server

    async def _checked(self, deadline: float | None = None) -> admin_pb2.GetServerInfoResponse:
        """GetServerInfo once, refused unless of this client's major API version."""
        if self._server_pb is not None:
            return self._server_pb
        async with self._check_lock:
            if self._server_pb is None:
                bound = time.monotonic() + self.connect_timeout
                limit = bound if deadline is None else min(deadline, bound)
                try:
                    resp: admin_pb2.GetServerInfoResponse = await self.stubs.admin.GetServerInfo(
                        admin_pb2.GetServerInfoRequest(), timeout=self._remaining(limit)
                    )
                except grpc.RpcError as err:
                    exc = from_rpc_error(err, self.address)
                else:
                    check_api_version(resp, self.address)
                    self._server_pb = resp
                    return resp
                raise exc
        return self._server_pb

    async def _check(self, deadline: float | None) -> None:
        """The first-use check before a call. A sandboxd that answers ENGINE_UNAVAILABLE has
        shown it is sandboxd but cannot report its version while its engine is down: the call
        goes ahead and tells its own story, and the next call checks again."""
        try:
            await self._checked(deadline)
        except EngineUnavailable:
            pass

    async def _unary(
        self,
        method: str,
        call: Callable[[float | None], Awaitable[T]],
        timeout: float | None,
        *,
        idempotent: bool | None = None,
        ends: CallEnd | None = None,
    ) -> T:
        """Run one unary call: version check, deadline, typed errors, retries if idempotent.

        gRPC's retry policy already retried idempotent methods on UNAVAILABLE; this loop adds
        retryable reasons of other codes, and every retryable error when `idempotent` is given
        for a method that is idempotent only by its request (CreateSession with an id).
        A client-streaming call passes the `ends` its request generator stops by; either way
        the server's status is reported, never the failed write that took its place.
        """
        full = f"{PACKAGE}.{method}"
        by_request = idempotent is True and full not in IDEMPOTENT
        may_retry = self.retry is not None and (full in IDEMPOTENT or by_request)
        deadline = self._deadline(timeout)
        await self._check(deadline)
        ends = ends or CallEnd()
        attempt = 0
        while True:
            try:
                return await ends.watch(call(self._remaining(deadline)))
            except grpc.RpcError as err:
                exc = from_rpc_error(ends.server_status(err), self.address)
            if not self._should_retry(exc, attempt, may_retry, by_request):
                raise exc
            assert self.retry is not None
            delay = self.retry.backoff(attempt)
            if deadline is not None and time.monotonic() + delay >= deadline:
                raise exc
            await asyncio.sleep(delay)
            attempt += 1

    def _should_retry(
        self, exc: SandboxError, attempt: int, may_retry: bool, by_request: bool
    ) -> bool:
        if not may_retry or not exc.retryable or self.retry is None:
            return False
        if attempt + 1 >= self.retry.max_attempts:
            return False
        # gRPC's policy has retried UNAVAILABLE already, unless the method is not in it.
        return by_request or exc.code != grpc.StatusCode.UNAVAILABLE

    async def _server_stream(
        self,
        call: Callable[[float | None], Any],
        timeout: float | None,
        *,
        ends: CallEnd | None = None,
    ) -> AsyncIterator[Any]:
        """Responses of a server-streaming (or bidi: `ends` as for `_unary`) call; leaving the
        loop early cancels the call."""
        deadline = self._deadline(timeout)
        await self._check(deadline)
        ends = ends or CallEnd()
        stream = ends.watch(call(self._remaining(deadline)))
        try:
            async for resp in stream:
                yield resp
        except grpc.RpcError as err:
            if ends.ended_ok(err):
                return
            exc = from_rpc_error(ends.server_status(err), self.address)
        else:
            return
        finally:
            stream.cancel()
        raise exc

    async def _paged(
        self,
        method: str,
        call: Callable[[str, float | None], Awaitable[Any]],
        timeout: float | None,
    ) -> AsyncIterator[Any]:
        """Each page of a List call (`call(page_token, deadline)`), following next_page_token."""
        token = ""
        while True:
            resp = await self._unary(method, functools.partial(call, token), timeout)
            yield resp
            token = resp.next_page_token
            if not token:
                return

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

    # -- snapshots not bound to a live session --

    @rpc("SnapshotService/GetSnapshot")
    async def get_snapshot(
        self, snapshot_id: str, *, timeout: float | None = UNSET
    ) -> SnapshotInfo:
        req = snapshot_pb2.GetSnapshotRequest(snapshot_id=snapshot_id)
        resp = await self._unary(
            "SnapshotService/GetSnapshot",
            lambda t: self.stubs.snapshots.GetSnapshot(req, timeout=t),
            timeout,
        )
        return models.SnapshotInfo.from_pb(resp.snapshot)

    @rpc("SnapshotService/ListSnapshots")
    async def list_snapshots(
        self,
        session_id: str = "",
        *,
        labels: Mapping[str, str] | None = None,
        page_size: int = 0,
        timeout: float | None = UNSET,
    ) -> AsyncIterator[SnapshotInfo]:
        """Snapshots of one session (or every session of the caller's) carrying all of
        `labels`, page by page."""

        async for resp in self._paged(
            "SnapshotService/ListSnapshots",
            lambda token, t: self.stubs.snapshots.ListSnapshots(
                snapshot_pb2.ListSnapshotsRequest(
                    session_id=session_id,
                    page_size=page_size,
                    page_token=token,
                    label_selector=dict(labels or {}),
                ),
                timeout=t,
            ),
            timeout,
        ):
            for snap in resp.snapshots:
                yield models.SnapshotInfo.from_pb(snap)

    @rpc("SnapshotService/DeleteSnapshot")
    async def delete_snapshot(self, snapshot_id: str, *, timeout: float | None = UNSET) -> None:
        req = snapshot_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id)
        await self._unary(
            "SnapshotService/DeleteSnapshot",
            lambda t: self.stubs.snapshots.DeleteSnapshot(req, timeout=t),
            timeout,
        )

    @rpc("SnapshotService/DownloadSnapshot")
    async def download_snapshot(
        self, snapshot_id: str, *, timeout: float | None = None
    ) -> AsyncIterator[bytes]:
        """The snapshot's tar, in chunks as they arrive."""
        req = snapshot_pb2.DownloadSnapshotRequest(snapshot_id=snapshot_id)
        async for resp in self._server_stream(
            lambda t: self.stubs.snapshots.DownloadSnapshot(req, timeout=t), timeout
        ):
            yield resp.chunk.data

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
