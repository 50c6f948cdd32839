"""SandboxClient's connection: the channel (opened by `async with`, closed on exit), its stubs,
the first-use version check, and the machinery every call goes through (deadline, typed errors,
retries, streams, pages). The calls themselves are SandboxClient's and its mixins'.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import grpc

from sandboxd_client import _channel
from sandboxd_client._call_end import CallEnd
from sandboxd_client._gen.sandboxd.v1 import admin_pb2, admin_pb2_grpc  # every first call
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import IDEMPOTENT, PACKAGE, UNSET, RetryPolicy
from sandboxd_client.errors import (
    DeadlineExceeded,
    EngineUnavailable,
    IncompatibleServer,
    SandboxError,
    from_rpc_error,
)

# The other services' generated modules load on first use: `sandboxctl exec` needs only the
# process service's (tests/clients/test_client_cli_imports.py checks what it loads).
if TYPE_CHECKING:
    from sandboxd_client import models
    from sandboxd_client._gen.sandboxd.v1 import (
        filesystem_pb2_grpc,
        process_pb2_grpc,
        session_pb2_grpc,
        snapshot_pb2_grpc,
    )
    from sandboxd_client.models import ServerInfo
else:
    models = lazy("sandboxd_client.models")  # the result dataclasses
    _V1 = "sandboxd_client._gen.sandboxd.v1."
    filesystem_pb2_grpc = lazy(_V1 + "filesystem_pb2_grpc")
    process_pb2_grpc = lazy(_V1 + "process_pb2_grpc")
    session_pb2_grpc = lazy(_V1 + "session_pb2_grpc")
    snapshot_pb2_grpc = lazy(_V1 + "snapshot_pb2_grpc")

API_VERSION = "v1"

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


class Connection:
    """One channel to a server and the machinery of every call made over it; SandboxClient's
    `__init__` sets the attributes declared here."""

    address: str
    timeout: float | None
    connect_timeout: float
    retry: RetryPolicy | None
    _token: str | None
    _tls: _channel.TLS | None
    _options: list[tuple[str, Any]]
    _state: _State
    _channel: grpc.aio.Channel | None
    _stubs: _Stubs | None
    _server_pb: admin_pb2.GetServerInfoResponse | None
    _server: ServerInfo | None
    _check_lock: asyncio.Lock

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
