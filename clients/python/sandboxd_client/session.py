"""One session's calls: processes, files, archives, snapshots, network, lifecycle.

A `Session` is a handle (an id and the last `SessionInfo` seen); `async with session:` deletes
the session on exit, so a crashed caller's container goes away with it rather than at the end
of its lease.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from google.protobuf import field_mask_pb2

from sandboxd_client._archive_codec import archive_compression as _archive_compression
from sandboxd_client._archive_codec import tar_codec as _tar_codec
from sandboxd_client._call_end import CallEnd
from sandboxd_client._convert import duration, enum_value
from sandboxd_client._gen.sandboxd.v1 import process_pb2
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import UNSET, rpc
from sandboxd_client.dir_watch import DirWatching
from sandboxd_client.events import Event, ProcessInfo, RunResult, events_of
from sandboxd_client.interaction import Interaction
from sandboxd_client.session_files import FileTransfers
from sandboxd_client.session_processes import ProcessHandles

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import filesystem_pb2, session_pb2, snapshot_pb2
else:  # loaded on first use (sandboxd_client._lazy)
    filesystem_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.filesystem_pb2")
    session_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.session_pb2")
    snapshot_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.snapshot_pb2")

if TYPE_CHECKING:
    from sandboxd_client import models
    from sandboxd_client.client import SandboxClient
    from sandboxd_client.models import (
        ArchiveImported,
        EgressEvent,
        FileInfo,
        NetworkPolicy,
        SessionInfo,
        SnapshotInfo,
    )
else:  # the result dataclasses, on first use (sandboxd_client._lazy)
    models = lazy("sandboxd_client.models")


def _exec_fields(
    session_id: str,
    argv: Sequence[str],
    cwd: str,
    env: Mapping[str, str] | None,
    stdin: bytes,
    timeout: float | None,
    max_output_bytes: int,
) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "argv": list(argv),
        "cwd": cwd,
        "env": dict(env or {}),
        "stdin": stdin,
        "timeout": duration(timeout),
        "max_output_bytes": max_output_bytes,
    }


class Session(ProcessHandles, FileTransfers, DirWatching):
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

    # -- processes --

    @rpc("ProcessService/Exec")
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
        deadline: float | None = None,
    ) -> AsyncIterator[Event]:
        """Run a command and yield its events as they happen: Started, Output..., Exited.

        `timeout` is the command's own (reported in Exited); `deadline` bounds the call.
        Leaving the loop early (break, an exception, cancellation) cancels the call, which
        kills the command's whole process tree on the server.
        """
        req = process_pb2.ExecRequest(
            **_exec_fields(self.id, argv, cwd, env, stdin, timeout, max_output_bytes)
        )
        stream = self._client._server_stream(
            lambda t: self._stubs.processes.Exec(req, timeout=t), deadline
        )
        async for event in events_of(stream, keepalives):
            yield event

    @rpc("ProcessService/Run")
    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output_bytes: int = 0,
        deadline: float | None = None,
        text: bool = False,
    ) -> RunResult:
        """Run a command and return its collected output (a non-zero exit is not raised).

        With `text` the result also has `stdout_text`/`stderr_text` (UTF-8, invalid bytes as
        U+FFFD), decoded by the server."""
        req = process_pb2.RunRequest(
            **_exec_fields(self.id, argv, cwd, env, stdin, timeout, max_output_bytes),
            output_encoding=(
                process_pb2.OUTPUT_ENCODING_UTF8_LOSSY
                if text
                else process_pb2.OUTPUT_ENCODING_BYTES
            ),
        )
        resp = await self._client._unary(
            "ProcessService/Run", lambda t: self._stubs.processes.Run(req, timeout=t), deadline
        )
        return RunResult.from_pb(resp)

    @rpc("ProcessService/Interact")
    def interact(
        self,
        argv: Sequence[str],
        *,
        pty: tuple[int, int] | None = None,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_output_bytes: int = 0,
        idle_timeout: float | None = None,
    ) -> Interaction:
        """A command with live stdin, signals and (with `pty=(rows, cols)`) a terminal.

        async with session.interact(["sh"], pty=(24, 80)) as proc:
            await proc.send(b"echo hi; exit 3\\n")
            async for event in proc: ...

        Unlike `run`, an interactive command has no deadline and no output cap unless
        `timeout` or `max_output_bytes` is given: it runs while it is used. `idle_timeout`
        (seconds; default the server's, 30 minutes) ends it after that long with no input and
        no output (`InteractIdle`).
        """
        start = process_pb2.InteractStart(
            request=process_pb2.ExecRequest(
                **_exec_fields(self.id, argv, cwd, env, b"", timeout, max_output_bytes)
            ),
            pty=process_pb2.PtySize(rows=pty[0], cols=pty[1]) if pty else None,
            idle_timeout=duration(idle_timeout),
        )
        return Interaction(self._client, start)

    @rpc("ProcessService/StartProcess")
    async def start_process(
        self,
        argv: Sequence[str],
        *,
        process_id: str = "",
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output_bytes: int = 0,
        deadline: float | None = UNSET,
        output_buffer_bytes: int = 0,
        keep_stdin_open: bool = False,
        request_id: str = "",
    ) -> ProcessInfo:
        """Start a background process: it outlives this call; `attach` replays its output.

        With `output_buffer_bytes` (the ring kept per stream) `max_output_bytes` is the cap
        that cuts output, as for `run`; without it, it is the ring size (deprecated meaning).
        `keep_stdin_open` lets `send_input` add stdin until `close_stdin`."""
        req = process_pb2.StartProcessRequest(
            **_exec_fields(self.id, argv, cwd, env, stdin, timeout, max_output_bytes),
            process_id=process_id,
            output_buffer_bytes=output_buffer_bytes,
            keep_stdin_open=keep_stdin_open,
            request_id=request_id,
        )
        resp = await self._client._unary(
            "ProcessService/StartProcess",
            lambda t: self._stubs.processes.StartProcess(req, timeout=t),
            deadline,
            idempotent=True if request_id else None,
        )
        return ProcessInfo.from_pb(resp.process)

    @rpc("ProcessService/AttachProcess")
    async def attach(
        self,
        process_id: str,
        *,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
        keepalives: bool = False,
        deadline: float | None = None,
    ) -> AsyncIterator[Event]:
        """A background process's output from the given offsets (replay), then live, then
        Exited. Output the server no longer holds arrives as an OutputGap."""
        req = process_pb2.AttachProcessRequest(
            session_id=self.id,
            process_id=process_id,
            stdout_offset=stdout_offset,
            stderr_offset=stderr_offset,
        )
        stream = self._client._server_stream(
            lambda t: self._stubs.processes.AttachProcess(req, timeout=t), deadline
        )
        async for event in events_of(stream, keepalives):
            yield event

    @rpc("ProcessService/ListProcesses")
    async def processes(
        self, *, page_size: int = 0, timeout: float | None = UNSET
    ) -> AsyncIterator[ProcessInfo]:
        """The background processes in start order, following pages as the loop goes."""
        async for resp in self._client._paged(
            "ProcessService/ListProcesses",
            lambda token, t: self._stubs.processes.ListProcesses(
                process_pb2.ListProcessesRequest(
                    session_id=self.id, page_size=page_size, page_token=token
                ),
                timeout=t,
            ),
            timeout,
        ):
            for p in resp.processes:
                yield ProcessInfo.from_pb(p)

    @rpc("ProcessService/SignalProcess")
    async def signal_process(
        self, process_id: str, signal: str = "SIGTERM", *, timeout: float | None = UNSET
    ) -> None:
        req = process_pb2.SignalProcessRequest(
            session_id=self.id, process_id=process_id, signal=signal
        )
        await self._client._unary(
            "ProcessService/SignalProcess",
            lambda t: self._stubs.processes.SignalProcess(req, timeout=t),
            timeout,
        )

    # -- files --

    @rpc("FilesystemService/ReadFile")
    async def read_file(self, path: str, *, timeout: float | None = UNSET) -> bytes:
        req = filesystem_pb2.ReadFileRequest(session_id=self.id, path=path)
        resp = await self._client._unary(
            "FilesystemService/ReadFile",
            lambda t: self._stubs.files.ReadFile(req, timeout=t),
            timeout,
        )
        content: bytes = resp.content
        return content

    @rpc("FilesystemService/WriteFile")
    async def write_file(
        self,
        path: str,
        content: bytes,
        *,
        mode: int = 0,
        make_parents: bool = False,
        timeout: float | None = UNSET,
    ) -> FileInfo:
        req = filesystem_pb2.WriteFileRequest(
            session_id=self.id, path=path, content=content, mode=mode, make_parents=make_parents
        )
        resp = await self._client._unary(
            "FilesystemService/WriteFile",
            lambda t: self._stubs.files.WriteFile(req, timeout=t),
            timeout,
        )
        return models.FileInfo.from_pb(resp.info)

    @rpc("FilesystemService/ListDir")
    async def list_dir(
        self,
        path: str = "",
        *,
        depth: int = 0,
        page_size: int = 0,
        timeout: float | None = UNSET,
    ) -> AsyncIterator[FileInfo]:
        """The entries beneath `path`, following pages as the loop goes (`page_size` 0: the
        whole listing in one reply, in walk order; else pages in path order)."""
        async for resp in self._client._paged(
            "FilesystemService/ListDir",
            lambda token, t: self._stubs.files.ListDir(
                filesystem_pb2.ListDirRequest(
                    session_id=self.id,
                    path=path,
                    depth=depth,
                    page_size=page_size,
                    page_token=token,
                ),
                timeout=t,
            ),
            timeout,
        ):
            for e in resp.entries:
                yield models.FileInfo.from_pb(e)

    @rpc("FilesystemService/Stat")
    async def stat(self, path: str, *, timeout: float | None = UNSET) -> FileInfo:
        req = filesystem_pb2.StatRequest(session_id=self.id, path=path)
        resp = await self._client._unary(
            "FilesystemService/Stat", lambda t: self._stubs.files.Stat(req, timeout=t), timeout
        )
        return models.FileInfo.from_pb(resp.info)

    @rpc("FilesystemService/Remove")
    async def remove(
        self, path: str, *, recursive: bool = False, timeout: float | None = UNSET
    ) -> None:
        req = filesystem_pb2.RemoveRequest(session_id=self.id, path=path, recursive=recursive)
        await self._client._unary(
            "FilesystemService/Remove", lambda t: self._stubs.files.Remove(req, timeout=t), timeout
        )

    @rpc("FilesystemService/MakeDir")
    async def make_dir(
        self, path: str, *, parents: bool = False, timeout: float | None = UNSET
    ) -> FileInfo:
        # Both names: a server from before make_parents reads `parents`.
        req = filesystem_pb2.MakeDirRequest(
            session_id=self.id, path=path, parents=parents, make_parents=parents
        )
        resp = await self._client._unary(
            "FilesystemService/MakeDir",
            lambda t: self._stubs.files.MakeDir(req, timeout=t),
            timeout,
        )
        return models.FileInfo.from_pb(resp.info)

    # -- archives and snapshots --

    @rpc("SnapshotService/ExportArchive")
    async def export_archive(
        self, path: str = "", *, deadline: float | None = None, compression: str = "auto"
    ) -> AsyncIterator[bytes]:
        """A tar of the folder `path` (empty: the whole workspace), in chunks as it is made.

        `compression` is how it travels, not what you get (always the plain tar): "auto" asks
        for zstd when the server has it (`archive_zstd`) and zstandard is installed, "zstd"
        asks for it anyway, "none" never does. zstd is made inside the sandbox: the server
        relays fewer bytes and this client decodes them."""
        wire = await _archive_compression(self._client, compression, deadline)
        req = snapshot_pb2.ExportArchiveRequest(session_id=self.id, path=path, compression=wire)
        decoder = None
        async for resp in self._client._server_stream(
            lambda t: self._stubs.snapshots.ExportArchive(req, timeout=t), deadline
        ):
            if resp.compression == snapshot_pb2.ARCHIVE_COMPRESSION_UNSPECIFIED:
                yield resp.chunk.data  # a plain tar (an older server ignores the ask)
                continue
            if decoder is None:
                decoder = _tar_codec().decoder()
            data = decoder.decompress(resp.chunk.data)
            if data:
                yield data

    @rpc("SnapshotService/ImportArchive")
    async def import_archive(
        self,
        chunks: AsyncIterable[bytes],
        path: str = "",
        *,
        replace: bool = False,
        deadline: float | None = None,
        compression: str = "auto",
    ) -> ArchiveImported:
        """Unpack a tar streamed from `chunks` into the folder `path`; the server checks every
        member before anything lands. `replace` empties the folder first. Never retried: the
        chunks cannot be replayed. `compression` as for `export_archive`: the chunks are the
        plain tar either way, compressed here when zstd is used."""
        wire = await _archive_compression(self._client, compression, deadline)

        async def requests() -> AsyncIterator[snapshot_pb2.ImportArchiveRequest]:
            header = snapshot_pb2.ImportArchiveHeader(
                session_id=self.id, path=path, replace=replace, compression=wire
            )
            yield snapshot_pb2.ImportArchiveRequest(header=header)
            if wire == snapshot_pb2.ARCHIVE_COMPRESSION_UNSPECIFIED:
                async for data in chunks:
                    if data:
                        yield snapshot_pb2.ImportArchiveRequest(data=data)
                return
            encoder = _tar_codec().encoder()
            async for data in chunks:
                out = encoder.compress(data) if data else b""
                if out:
                    yield snapshot_pb2.ImportArchiveRequest(data=out)
            yield snapshot_pb2.ImportArchiveRequest(data=encoder.flush())

        ends = CallEnd()  # the server's refusal ends the upload: stop reading `chunks`
        resp = await self._client._unary(
            "SnapshotService/ImportArchive",
            lambda t: self._stubs.snapshots.ImportArchive(ends.until_ended(requests()), timeout=t),
            deadline,
            ends=ends,
        )
        return models.ArchiveImported(files=resp.files, bytes=resp.bytes)

    @rpc("SnapshotService/CreateSnapshot")
    async def snapshot(
        self,
        *,
        kind: str = "",
        labels: Mapping[str, str] | None = None,
        request_id: str = "",
        timeout: float | None = UNSET,
    ) -> SnapshotInfo:
        """Snapshot the workspace ("TAR", the default) or the whole container ("IMAGE").
        With a `request_id` the call is retried safely: a retry returns the first snapshot."""
        req = snapshot_pb2.CreateSnapshotRequest(
            session_id=self.id,
            labels=dict(labels or {}),
            kind=enum_value(snapshot_pb2.SnapshotKind, kind, "SNAPSHOT_KIND_"),
            request_id=request_id,
        )
        resp = await self._client._unary(
            "SnapshotService/CreateSnapshot",
            lambda t: self._stubs.snapshots.CreateSnapshot(req, timeout=t),
            timeout,
            idempotent=True if request_id else None,
        )
        return models.SnapshotInfo.from_pb(resp.snapshot)

    def snapshots(self, *, page_size: int = 0) -> AsyncIterator[SnapshotInfo]:
        """This session's snapshots (ListSnapshots)."""
        return self._client.list_snapshots(self.id, page_size=page_size)
