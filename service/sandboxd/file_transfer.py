"""Streaming file transfer and Move: files up to the session's workspace_bytes, never whole in
server memory (ReadFile and WriteFile stay bounded by one gRPC message).

The bytes pass through the `sbx` helper (`read`, `write`, `move`), which resolves paths beneath
/workspace with openat2, so a symlink a command planted can never lead a transfer out of it.

A streamed write is all or nothing twice over: `sbx write` fills a temporary file beside the
target, and the server renames it over the target (`sbx move`) only after the client's last
chunk. A call that fails or is cancelled midway therefore never touches the target, whatever
the helper does with the half-written upload, and the upload is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator

from sandboxd import domain_events, validation
from sandboxd.engine import ExecStream
from sandboxd.errors import Internal, InvalidArgument, OutOfRange, SandboxError
from sandboxd.files import parse_records
from sandboxd.helper_client import STDERR_LIMIT, HelperClient, HelperResult, drain, file_error
from sandboxd.models import FileInfo, Session
from sandboxd.reasons import Reason

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024  # largest chunk sent; small messages keep memory and latency low
HEADER_BYTES = 4096  # the `sbx read` header line is far shorter
UPLOAD_PREFIX = ".sbx-upload-"
# After a failed upload's `sbx write` ended, how long its removal may take.
CLEANUP_TIMEOUT_S = 30.0
# The writer's own bound on a silent stdin, beyond the wait for the client's next chunk: an
# engine need not pass EOF on when the call's connection drops, and the writer then ends itself.
WRITER_IDLE_MARGIN_S = 5.0


def _upload_name(rel: str) -> str:
    parent, _, _ = rel.rpartition("/")
    name = f"{UPLOAD_PREFIX}{secrets.token_hex(8)}.part"
    return f"{parent}/{name}" if parent else name


class FileTransfer:
    """ReadFileStream, WriteFileStream and Move over the `sbx` helper."""

    def __init__(
        self,
        helper: HelperClient,
        upload_idle_s: float = 60.0,
        observer: domain_events.Observer = domain_events.SILENT,
    ) -> None:
        """`upload_idle_s`: the longest wait for a client's next chunk (the tenancy section's
        `stream_idle_timeout_s`); the in-sandbox writer gives up a little after it. `observer`
        hears of each file written and moved (the audit log)."""
        self.helper = helper
        self._observer = observer
        self._writer_idle_ms = int((upload_idle_s + WRITER_IDLE_MARGIN_S) * 1000)
        self._cleanups: set[asyncio.Task[None]] = set()

    async def close(self, timeout_s: float = CLEANUP_TIMEOUT_S) -> None:
        """Server shutdown: let the removals of failed uploads finish for `timeout_s`, then
        cancel what is left (its writer still ends itself on its idle bound)."""
        if self._cleanups:
            await asyncio.wait(self._cleanups, timeout=timeout_s)
        for task in list(self._cleanups):
            task.cancel()
        await asyncio.gather(*self._cleanups, return_exceptions=True)

    async def read(
        self, session: Session, path: str, offset: int, length: int
    ) -> AsyncIterator[tuple[int, bytes]]:
        """(offset, bytes) chunks of the file from `offset`, `length` bytes at most (0: all)."""
        rel = validation.workspace_relpath(path, allow_root=False)
        if offset < 0 or length < 0:
            raise InvalidArgument(
                "offset and length must not be negative",
                reason=Reason.INVALID_OFFSET,
                metadata={"path": rel},
            )
        cap = session.spec.limits.workspace_bytes
        end = offset + length if length else None
        stderr = bytearray()
        pending = bytearray()
        size: int | None = None
        position = 0  # file offset of the next byte the helper prints
        async with self.helper.open(session, ["read", rel, str(cap)]) as stream:
            while (item := await stream.read()) is not None:
                fd, data = item
                if fd != 1:
                    stderr += data[: STDERR_LIMIT - len(stderr)]
                    continue
                if size is None:
                    pending += data
                    header, sep, data = bytes(pending).partition(b"\n")
                    if not sep:
                        if len(pending) > HEADER_BYTES:
                            raise Internal("file helper printed no header")
                        continue
                    size = _size(header)
                    if offset > size:
                        raise OutOfRange(
                            f"{rel}: offset {offset} is past the end of the file ({size} bytes)",
                            reason=Reason.OFFSET_OUT_OF_RANGE,
                            metadata={"path": rel, "size": str(size)},
                        )
                skip = max(0, offset - position)
                start = position + skip
                position += len(data)
                piece = data[skip:]
                if end is not None:
                    piece = piece[: max(0, end - start)]
                for i in range(0, len(piece), CHUNK_BYTES):
                    yield start + i, piece[i : i + CHUNK_BYTES]
                if end is not None and position >= end:
                    return  # the rest is not wanted: leaving ends the helper
            code = await stream.wait_exit_code()
        if code != 0:
            raise file_error(HelperResult(code, b"", bytes(stderr)), rel)
        if size is None:
            raise Internal("file helper printed no header")

    async def write(
        self,
        session: Session,
        path: str,
        mode: int,
        make_parents: bool,
        chunks: AsyncIterator[bytes],
    ) -> FileInfo:
        """Write the chunks to `path`, replacing it only once they all arrived."""
        rel = validation.workspace_relpath(path, allow_root=False)
        asked = mode
        mode = validation.validate_file_mode(mode, default=0o644)
        cap = session.spec.limits.workspace_bytes
        upload = _upload_name(rel)
        args = [
            "write",
            upload,
            format(mode, "o"),
            str(cap),
            "--idle-ms",
            str(self._writer_idle_ms),
        ]
        args += ["--parents"] if make_parents else []
        exec_id: str | None = None
        sent = 0
        try:
            async with self.helper.open(session, args, stdin=True) as stream:
                exec_id = stream.exec_id
                # EOF only after the client's last chunk: it is the writer's go-ahead to give
                # the upload its name. A call that fails before never sends it, and leaving
                # this block ends the writer (the agent signals it before closing its stdin;
                # over `docker exec` its `--idle-ms` bound ends it), which removes its own
                # temp file.
                async for data in chunks:
                    sent += len(data)
                    await stream.write(data)
                stream.close_stdin()
                out, err, code = await _outcome_of_writer(stream)
            if code != 0:
                raise file_error(HelperResult(code, out, err), rel)
            info = await self._move(session, upload, rel, overwrite=True, shown=rel)
        except BaseException:
            if exec_id is not None:
                # Shielded: a cancelled call still has its upload removed, by our own task.
                await asyncio.shield(self._remove_later(session, upload, exec_id))
            raise
        self._observer.emit(
            domain_events.FileWritten(
                session.tenant, session.session_id, path, sent, asked, info.size
            )
        )
        return info

    async def move(
        self, session: Session, source: str, destination: str, overwrite: bool
    ) -> FileInfo:
        info = await self._move(session, source, destination, overwrite)
        self._observer.emit(
            domain_events.FileMoved(
                session.tenant, session.session_id, source, destination, overwrite, info.size
            )
        )
        return info

    async def _move(
        self,
        session: Session,
        source: str,
        destination: str,
        overwrite: bool,
        shown: str = "",
    ) -> FileInfo:
        src = validation.workspace_relpath(source, allow_root=False)
        dst = validation.workspace_relpath(destination, allow_root=False)
        args = ["move", src, dst] + (["--overwrite"] if overwrite else [])
        result = await self.helper.checked(session, args, shown or src, max_stdout=64 * 1024)
        return parse_records(result.stdout)[0]

    async def _running(self, exec_id: str) -> bool:
        """Whether the helper still runs; an exec the engine no longer knows has ended."""
        try:
            return (await self.helper.commands.status(exec_id)).running
        except SandboxError:
            return False

    def _remove_later(self, session: Session, upload: str, exec_id: str) -> asyncio.Task[None]:
        """Remove a failed upload once its `sbx write` has ended (a helper whose stdin was cut
        may still finish the file after the call is gone), in a task of our own."""

        async def remove() -> None:
            try:
                # The writer ends on EOF, on its idle bound, or with the call's connection.
                async with asyncio.timeout(self._writer_idle_ms / 1000 + CLEANUP_TIMEOUT_S):
                    while await self._running(exec_id):
                        await asyncio.sleep(0.05)
                    await self.helper.run(session, ["remove", upload])
            except (SandboxError, TimeoutError, OSError) as exc:
                log.warning("a failed upload %s was not removed: %s", upload, exc)

        task = asyncio.create_task(remove(), name=f"remove upload {upload}")
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
        return task


async def _outcome_of_writer(stream: ExecStream) -> tuple[bytes, bytes, int]:
    """The writer's stdout, stderr and exit code, after its EOF was sent.

    From EOF on, the writer completes on its own in a moment (close, rename). A call cancelled
    now still waits for that, bounded, before the stream is closed: closing it would end the
    writer perhaps midway through its rename, and the removal of the upload that follows must
    come after the rename, not race it.
    """

    async def outcome() -> tuple[bytes, bytes, int]:
        out, err = await drain(stream, max_stdout=64 * 1024)
        return out, err, await stream.wait_exit_code()

    task = asyncio.ensure_future(outcome())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, CLEANUP_TIMEOUT_S)
        raise


def _size(header: bytes) -> int:
    try:
        return int(json.loads(header)["size"])
    except (ValueError, KeyError, TypeError) as exc:
        raise Internal(f"file helper printed an unexpected header: {exc}") from exc
