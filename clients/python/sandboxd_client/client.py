"""An asyncio client for sandboxd over the generated stubs.

    async with SandboxClient("127.0.0.1:50051") as client:
        async with await client.create_session(allow=["echo"]) as session:
            result = await session.run(["echo", "hi"])

The client owns one channel (opened by `async with`, closed on exit). Every failed call is
raised as a `sandboxd_client.errors.SandboxError` subclass, never as a raw `grpc.RpcError`.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import grpc
from google.protobuf import duration_pb2
from sandboxd.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    filesystem_pb2,
    filesystem_pb2_grpc,
    process_pb2,
    process_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

from sandboxd_client.errors import from_rpc_error

DEFAULT_ADDRESS = "127.0.0.1:50051"
_MAX_MESSAGE = 64 * 1024 * 1024

T = TypeVar("T")


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPENED = "opened"
    CLOSED = "closed"


def _duration(seconds: float | None) -> duration_pb2.Duration | None:
    if seconds is None:
        return None
    d = duration_pb2.Duration()
    d.FromTimedelta(dt.timedelta(seconds=seconds))
    return d


async def _call(awaitable: Awaitable[T]) -> T:
    try:
        return await awaitable
    except grpc.RpcError as err:
        raise from_rpc_error(err) from None


# ---- exec events ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """The command has started."""

    process_id: str


@dataclass(frozen=True)
class Output:
    """A chunk of the command's output; `offset` is its byte position within its stream."""

    stream: Literal["stdout", "stderr"]
    data: bytes
    offset: int


@dataclass(frozen=True)
class Exited:
    """Always the last event. A timeout, a cap or a kill is reported here, not raised."""

    exit_code: int
    signal: str
    timed_out: bool
    truncated: bool
    duration: float


@dataclass(frozen=True)
class Keepalive:
    """The server's sign of life on a quiet stream (only yielded when asked for)."""


Event = Started | Output | Exited | Keepalive


def _event(resp: process_pb2.ExecResponse) -> Event | None:
    kind = resp.WhichOneof("event")
    if kind == "started":
        return Started(resp.started.process_id)
    if kind == "output":
        out = resp.output
        stream: Literal["stdout", "stderr"] = (
            "stderr" if out.stream == process_pb2.OUTPUT_STREAM_STDERR else "stdout"
        )
        return Output(stream, out.data, out.offset)
    if kind == "exited":
        ex = resp.exited
        return Exited(
            ex.exit_code,
            ex.signal,
            ex.timed_out,
            ex.truncated,
            ex.duration.ToTimedelta().total_seconds(),
        )
    if kind == "keepalive":
        return Keepalive()
    return None  # an event kind newer than this client: skipped


@dataclass(frozen=True)
class RunResult:
    """A command's collected result."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    truncated: bool = False
    signal: str = ""
    duration: float = 0.0
    process_id: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.truncated


# ---- sessions --------------------------------------------------------------------------------


class Session:
    """One sandbox session. Its methods call the server; `info` is the last reply seen.

    `async with session:` deletes the session on exit, so a crashed caller's container goes
    away with it rather than at the end of its lease.
    """

    def __init__(self, client: SandboxClient, info: session_pb2.Session) -> None:
        self._client = client
        self.info = info

    @property
    def _t(self) -> float | None:
        return self._client._opts.timeout

    @property
    def id(self) -> str:
        return self.info.session_id

    @property
    def state(self) -> str:
        """The state's short name: "RUNNING", "EXPIRED", ..."""
        return session_pb2.SessionState.Name(self.info.state).removeprefix("SESSION_STATE_")

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.info.labels)

    @property
    def lease_expires_at(self) -> dt.datetime:
        return self.info.lease_expires_at.ToDatetime(tzinfo=dt.UTC)

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

    async def refresh(self) -> Self:
        """Fetch the session's current state."""
        self.info = (await self._client._get_session_info(self.id)).session
        return self

    async def renew(self, ttl: float | None = None) -> Self:
        """Extend the lease to `ttl` seconds from now (the server's default when None)."""
        req = session_pb2.RenewLeaseRequest(session_id=self.id, ttl=_duration(ttl))
        self.info = (await _call(self._client._sessions.RenewLease(req, timeout=self._t))).session
        return self

    async def delete(self) -> None:
        """Remove the session and its container; deleting twice is not an error."""
        req = session_pb2.DeleteSessionRequest(session_id=self.id)
        await _call(self._client._sessions.DeleteSession(req, timeout=self._t))

    # -- processes --

    def _exec_fields(
        self,
        argv: Sequence[str],
        cwd: str,
        env: Mapping[str, str] | None,
        stdin: bytes,
        timeout: float | None,
        max_output_bytes: int,
    ) -> dict[str, Any]:
        return {
            "session_id": self.id,
            "argv": list(argv),
            "cwd": cwd,
            "env": dict(env or {}),
            "stdin": stdin,
            "timeout": _duration(timeout),
            "max_output_bytes": max_output_bytes,
        }

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output_bytes: int = 0,
        keepalives: bool = False,
    ) -> AsyncIterator[Event]:
        """Run a command and yield its events as they happen: Started, Output..., Exited.

        Leaving the loop early (break, an exception, cancellation) cancels the call, which
        kills the command's whole process tree on the server.
        """
        req = process_pb2.ExecRequest(
            **self._exec_fields(argv, cwd, env, stdin, timeout, max_output_bytes)
        )
        call = self._client._processes.Exec(req)
        try:
            async for resp in call:
                event = _event(resp)
                if event is None or (isinstance(event, Keepalive) and not keepalives):
                    continue
                yield event
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        finally:
            call.cancel()

    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output_bytes: int = 0,
    ) -> RunResult:
        """Run a command and return its collected output (a non-zero exit is not raised)."""
        req = process_pb2.RunRequest(
            **self._exec_fields(argv, cwd, env, stdin, timeout, max_output_bytes)
        )
        r = await _call(self._client._processes.Run(req))
        return RunResult(
            exit_code=r.exit_code,
            stdout=r.stdout,
            stderr=r.stderr,
            timed_out=r.timed_out,
            truncated=r.truncated,
            signal=r.signal,
            duration=r.duration.ToTimedelta().total_seconds(),
            process_id=r.process_id,
        )

    # -- files --

    async def read_file(self, path: str) -> bytes:
        req = filesystem_pb2.ReadFileRequest(session_id=self.id, path=path)
        resp: filesystem_pb2.ReadFileResponse = await _call(
            self._client._files.ReadFile(req, timeout=self._t)
        )
        return resp.content

    async def write_file(
        self, path: str, content: bytes, *, mode: int = 0, make_parents: bool = False
    ) -> filesystem_pb2.FileInfo:
        req = filesystem_pb2.WriteFileRequest(
            session_id=self.id, path=path, content=content, mode=mode, make_parents=make_parents
        )
        resp: filesystem_pb2.WriteFileResponse = await _call(
            self._client._files.WriteFile(req, timeout=self._t)
        )
        return resp.info

    async def list_dir(self, path: str = "", *, depth: int = 0) -> list[filesystem_pb2.FileInfo]:
        req = filesystem_pb2.ListDirRequest(session_id=self.id, path=path, depth=depth)
        resp: filesystem_pb2.ListDirResponse = await _call(
            self._client._files.ListDir(req, timeout=self._t)
        )
        return list(resp.entries)

    async def stat(self, path: str) -> filesystem_pb2.FileInfo:
        req = filesystem_pb2.StatRequest(session_id=self.id, path=path)
        resp: filesystem_pb2.StatResponse = await _call(
            self._client._files.Stat(req, timeout=self._t)
        )
        return resp.info

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        req = filesystem_pb2.RemoveRequest(session_id=self.id, path=path, recursive=recursive)
        await _call(self._client._files.Remove(req, timeout=self._t))

    async def make_dir(self, path: str, *, parents: bool = False) -> filesystem_pb2.FileInfo:
        req = filesystem_pb2.MakeDirRequest(session_id=self.id, path=path, parents=parents)
        resp: filesystem_pb2.MakeDirResponse = await _call(
            self._client._files.MakeDir(req, timeout=self._t)
        )
        return resp.info

    # -- tar transfer --

    async def export_archive(self, path: str = "") -> AsyncIterator[bytes]:
        """A tar of the folder `path` (empty: the whole workspace), in chunks as it is made."""
        req = snapshot_pb2.ExportArchiveRequest(session_id=self.id, path=path)
        call = self._client._snapshots.ExportArchive(req)
        try:
            async for resp in call:
                yield resp.chunk.data
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        finally:
            call.cancel()

    async def import_archive(
        self, chunks: AsyncIterable[bytes], path: str = "", *, replace: bool = False
    ) -> ArchiveImported:
        """Unpack a tar streamed from `chunks` into the folder `path`; the server checks every
        member before anything lands. `replace` empties the folder first."""

        async def requests() -> AsyncIterator[snapshot_pb2.ImportArchiveRequest]:
            header = snapshot_pb2.ImportArchiveHeader(
                session_id=self.id, path=path, replace=replace
            )
            yield snapshot_pb2.ImportArchiveRequest(header=header)
            async for data in chunks:
                if data:
                    yield snapshot_pb2.ImportArchiveRequest(data=data)

        resp: snapshot_pb2.ImportArchiveResponse = await _call(
            self._client._snapshots.ImportArchive(requests())
        )
        return ArchiveImported(files=resp.files, bytes=resp.bytes)


@dataclass(frozen=True)
class ArchiveImported:
    """What an import wrote: members (files, folders, links) and bytes of file content."""

    files: int
    bytes: int


# ---- the client ------------------------------------------------------------------------------


class _BearerToken(grpc.AuthMetadataPlugin):  # type: ignore[misc]
    """Adds `authorization: Bearer <token>` to every call (TLS channels)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        callback((("authorization", f"Bearer {self._token}"),), None)


@dataclass(frozen=True)
class TLS:
    """TLS settings: PEM bytes; all None means the system's root certificates."""

    root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    server_name: str | None = None  # overrides the name checked against the certificate


@dataclass
class _Options:
    token: str | None = None
    tls: TLS | None = None
    timeout: float | None = None
    extra: list[tuple[str, Any]] = field(default_factory=list)


class SandboxClient:
    """A connection to one sandboxd server; use as `async with SandboxClient(addr) as c`.

    `token` is sent as a bearer token on every call; over a plaintext channel too, since the
    server's default is loopback only (a token over a non-loopback plaintext link is visible to
    anyone on the path: pass `tls=TLS()` there). `timeout` is a per-call deadline in seconds for
    unary calls (streams run as long as the command).
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        token: str | None = None,
        tls: TLS | None = None,
        timeout: float | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.address = address
        self._opts = _Options(token, tls, timeout, list(options))
        self._state = _State.UNOPENED
        self._channel: grpc.aio.Channel | None = None

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
        o = self._opts
        options = [
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            *o.extra,
        ]
        interceptors: list[grpc.aio.ClientInterceptor] = []
        if o.tls is not None:
            creds = grpc.ssl_channel_credentials(
                o.tls.root_certificates, o.tls.private_key, o.tls.certificate_chain
            )
            if o.token is not None:
                creds = grpc.composite_channel_credentials(
                    creds, grpc.metadata_call_credentials(_BearerToken(o.token))
                )
            if o.tls.server_name:
                options.append(("grpc.ssl_target_name_override", o.tls.server_name))
            self._channel = grpc.aio.secure_channel(self.address, creds, options=options)
        else:
            if o.token is not None:
                interceptors = list(_token_interceptors(o.token))
            self._channel = grpc.aio.insecure_channel(
                self.address, options=options, interceptors=interceptors
            )
        ch = self._channel
        self._sessions = session_pb2_grpc.SessionServiceStub(ch)
        self._processes = process_pb2_grpc.ProcessServiceStub(ch)
        self._files = filesystem_pb2_grpc.FilesystemServiceStub(ch)
        self._admin = admin_pb2_grpc.AdminServiceStub(ch)
        self._snapshots = snapshot_pb2_grpc.SnapshotServiceStub(ch)
        self._state = _State.OPENED

    async def close(self) -> None:
        if self._channel is not None and self._state is _State.OPENED:
            await self._channel.close()
        self._state = _State.CLOSED

    @property
    def channel(self) -> grpc.aio.Channel:
        """The underlying channel, for services this client does not wrap yet."""
        if self._channel is None or self._state is not _State.OPENED:
            raise RuntimeError(f"client is {self._state.value}; use `async with SandboxClient()`")
        return self._channel

    # -- sessions --

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
        limits: common_pb2.ResourceLimits | None = None,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        lease_ttl: float | None = None,
        user: str = "",
        request: session_pb2.CreateSessionRequest | None = None,
    ) -> Session:
        """Create a session (idempotent with a `session_id`); `request` overrides the rest.

        Every command is denied unless named in `allow` or `allow_all` is set.
        """
        if request is None:
            request = session_pb2.CreateSessionRequest(
                session_id=session_id,
                workspace=session_pb2.WorkspaceManifest(
                    id=workspace_id,
                    files=[
                        session_pb2.ManifestFile(path=p, content=c)
                        for p, c in (files or {}).items()
                    ],
                    directories=list(directories),
                ),
                image=image,
                limits=limits,
                shell=common_pb2.ShellPolicy(allow=list(allow), allow_all=allow_all),
                env=dict(env or {}),
                labels=dict(labels or {}),
                lease_ttl=_duration(lease_ttl),
                user=user,
            )
        resp = await _call(self._sessions.CreateSession(request, timeout=self._opts.timeout))
        return Session(self, resp.session)

    async def _get_session_info(self, session_id: str) -> session_pb2.GetSessionResponse:
        req = session_pb2.GetSessionRequest(session_id=session_id)
        return await _call(self._sessions.GetSession(req, timeout=self._opts.timeout))

    async def get_session(self, session_id: str) -> Session:
        return Session(self, (await self._get_session_info(session_id)).session)

    def session(self, session_id: str) -> Session:
        """A handle on an existing session, without a call (its `info` holds only the id)."""
        return Session(self, session_pb2.Session(session_id=session_id))

    async def list_sessions(
        self, labels: Mapping[str, str] | None = None, *, page_size: int = 0
    ) -> AsyncIterator[Session]:
        """Every session carrying all of `labels`, following pages as the loop goes."""
        token = ""
        while True:
            req = session_pb2.ListSessionsRequest(
                label_selector=dict(labels or {}), page_size=page_size, page_token=token
            )
            resp = await _call(self._sessions.ListSessions(req, timeout=self._opts.timeout))
            for info in resp.sessions:
                yield Session(self, info)
            token = resp.next_page_token
            if not token:
                return

    async def server_info(self) -> admin_pb2.GetServerInfoResponse:
        req = admin_pb2.GetServerInfoRequest()
        return await _call(self._admin.GetServerInfo(req, timeout=self._opts.timeout))


def _token_interceptors(token: str) -> Sequence[grpc.aio.ClientInterceptor]:
    """Interceptors adding the bearer token to every kind of call on a plaintext channel."""
    pair = ("authorization", f"Bearer {token}")

    def with_token(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), pair)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    class Unary(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
        async def intercept_unary_unary(
            self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails, req: Any
        ) -> Any:
            return await continuation(with_token(details), req)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
        async def intercept_unary_stream(
            self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails, req: Any
        ) -> Any:
            return await continuation(with_token(details), req)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
        async def intercept_stream_unary(
            self,
            continuation: Callable[..., Any],
            details: grpc.aio.ClientCallDetails,
            reqs: AsyncIterable[Any],
        ) -> Any:
            return await continuation(with_token(details), reqs)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
        async def intercept_stream_stream(
            self,
            continuation: Callable[..., Any],
            details: grpc.aio.ClientCallDetails,
            reqs: AsyncIterable[Any],
        ) -> Any:
            return await continuation(with_token(details), reqs)

    return (Unary(), UnaryStream(), StreamUnary(), StreamStream())
