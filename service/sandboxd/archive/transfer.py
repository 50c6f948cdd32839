"""Tar transfer in and out of a session's workspace: the orchestration.

Export runs `tar -c` inside the container (under the `sbx run` supervisor, whose `--cwd`
check keeps the folder inside /workspace) and forwards its stdout in chunks as it comes:
the archive is never held whole in memory, and a stream longer than the workspace cap plus
tar's overhead (a sparse file) stops with RESOURCE_EXHAUSTED. tar does not follow symlinks
when creating. Snapshots (CreateSnapshot, Suspend, the shutdown snapshot) export through here
and get the same cap.

Import never lets an unchecked byte land where it counts. The client's stream is parsed with
Python's tarfile, forward only as it streams, on a dedicated thread (pipe.py); every member is
checked against SECURITY.md's archive rules (policy.py) and re-emitted, sanitised, to `tar -x`
in a fresh staging folder inside the workspace. Only when the whole archive was good and tar
succeeded does `sbx merge` move the staged entries into place with renameat (never through a
symlink). Any refusal removes the staging folder: the workspace is as it was.

Every tar and helper run goes through the helper client, without the session's environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import tarfile
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from sandboxd import validation
from sandboxd.archive import policy
from sandboxd.archive.pipe import (
    BLOCK,
    INBOX_BYTES,
    OUT_BATCH,
    OUTBOX_BYTES,
    Cancelled,
    Inbox,
    Outbox,
    Sink,
    SinkError,
    Source,
    join_thread,
    retrieve,
    settle,
)
from sandboxd.archive.policy import ArchiveLimits, MemberChecker
from sandboxd.engine import Engine
from sandboxd.errors import AlreadyExists, InvalidArgument, ResourceExhausted, SandboxError
from sandboxd.files import Files
from sandboxd.helper_client import (
    STDERR_LIMIT,
    HelperClient,
    HelperResult,
    NoRoom,
    drain,
    tool_argv,
    tool_error,
)
from sandboxd.models import FileType, Session
from sandboxd.reasons import Reason

log = logging.getLogger(__name__)

# Measured (export of a 48 MiB workspace to a separate client process, median of 5, twice):
# 64 KiB chunks 113-123 MB/s, 256 KiB 149-151, 1 MiB 154-159; under heavy load all within
# noise, 4 MiB worse. Per-message gRPC cost dominates small chunks; 256 KiB gets nearly all
# of the gain at a quarter of 1 MiB's memory per message in flight.
CHUNK_BYTES = 256 * 1024
MAX_TRAILING_BYTES = 1024 * 1024  # after the end-of-archive marker (tar pads to 10 KiB records)
SPOOL_READ_BYTES = 256 * 1024
STAGE_PREFIX = ".sbx-import-"
_ZEROS = bytes(BLOCK)


@dataclass(frozen=True)
class ImportResult:
    files: int
    bytes: int


def check_and_forward(source: Source, sink: Sink | None, checker: MemberChecker) -> tuple[int, int]:
    """Runs on the import thread: parse, check, re-emit. Returns (members, content bytes).

    tarfile parses the headers (`r:` over the forward-only source); each member goes out as
    the header tarfile would write for the sanitised TarInfo (`addfile` in PAX format), then
    its data passed through as it came, then the padding; at the end, tarfile's end blocks.
    """
    written = 0
    try:
        src = tarfile.open(fileobj=source, mode="r:")  # type: ignore[call-overload]
    except tarfile.ReadError as exc:
        raise InvalidArgument(
            f"the data is not a tar archive ({exc})", reason=Reason.ARCHIVE_INVALID
        ) from None
    try:
        while True:
            try:
                info = src.next()
            except tarfile.TarError as exc:
                raise InvalidArgument(
                    f"the archive is damaged ({exc})", reason=Reason.ARCHIVE_INVALID
                ) from None
            except RecursionError:  # tarfile recurses once per chained extension header
                raise policy.invalid("too many extended headers in a row") from None
            if info is None:
                break
            # tarfile keeps every TarInfo it has seen: 100 000 members would be tens of MiB.
            # Nothing here looks back, so let them go.
            src.members.clear()
            policy.check_global_headers(src.pax_headers)
            clean = checker.check(info)
            if clean is None:
                continue
            if sink is not None:
                sink.limit = policy.stream_allowance(
                    checker.limits.max_total_bytes, checker.members
                )
            if sink is not None:
                sink.write(clean.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape"))
            if clean.isreg():
                remaining = clean.size
                while remaining:
                    view = source.read_view(min(remaining, OUT_BATCH))
                    if not view:
                        raise _truncated(info.name)
                    if sink is not None:
                        sink.write(view)
                    remaining -= len(view)
                if sink is not None and clean.size % BLOCK:
                    sink.write(_ZEROS[: BLOCK - clean.size % BLOCK])
                written += clean.size
        _check_end(source, src.offset)
        if sink is not None:
            # tarfile's close() in `w` mode: two zero blocks, then zeros to a whole record.
            end = 2 * BLOCK + (-(sink.written + 2 * BLOCK)) % tarfile.RECORDSIZE
            sink.write(bytes(end))
            sink.flush()
    finally:
        src.close()
    return checker.members, written


def _too_large(path: str, cap: int) -> ResourceExhausted:
    return ResourceExhausted(
        f"the archive of {path!r} is over {cap} bytes, more than the workspace can hold plus "
        "tar's overhead (a sparse file?)",
        reason=Reason.ARCHIVE_TOO_LARGE,
        metadata={"path": path, "limit": str(cap)},
    )


def _truncated(name: str) -> InvalidArgument:
    return InvalidArgument(
        f"the archive ends inside member {name!r} (truncated, or the header lies about its size)",
        reason=Reason.ARCHIVE_TRUNCATED,
        metadata={"member": name[:512]},
    )


def _check_end(source: Source, offset: int) -> None:
    """tarfile's stream mode ends quietly on a missing or garbage header: refuse both."""
    block = source.block_at(offset)
    if block is None or len(block) < BLOCK:
        raise InvalidArgument(
            "the archive is truncated (no end-of-archive marker)", reason=Reason.ARCHIVE_TRUNCATED
        )
    if block.count(0) != BLOCK:
        raise InvalidArgument(
            "the archive holds data that is not a tar header (damaged, or a member lies about "
            "its size)",
            reason=Reason.ARCHIVE_INVALID,
        )


class ArchiveIO:
    """Export and import through exec; holds no per-call state."""

    def __init__(
        self,
        engine: Engine,
        files: Files,
        max_members: int = policy.DEFAULT_MAX_MEMBERS,
        spool_dir: Path | None = None,
        helper: HelperClient | None = None,
    ) -> None:
        policy.ensure_safe_tarfile()  # start-up: no imports on a tarfile with CVE-2024-6232
        del engine  # kept in the signature: the helper client (via files) runs everything
        self._helper_client = helper or files.helper
        self._files = files
        self._max_members = max_members
        self._spool_dir = spool_dir or Path(tempfile.gettempdir())

    async def _is_file(self, session: Session, rel: str) -> bool:
        """Whether `rel` is a regular file (anything else exports as a folder, or fails as
        one); `sbx stat` never follows a symlink."""
        result = await self._helper_client.run(session, ["stat", rel])
        if result.exit_code != 0:
            return False  # the folder export reports what is wrong with the path
        try:
            return bool(json.loads(result.stdout.splitlines()[0]).get("type") == "file")
        except (ValueError, IndexError, AttributeError):
            return False

    async def export(self, session: Session, path: str) -> AsyncIterator[bytes]:
        """Yields the tar of `path` in chunks as tar writes it; raises if tar fails.

        Stops with RESOURCE_EXHAUSTED (tar killed, nothing more sent) once the stream passes
        what the workspace can hold plus tar's overhead: a sparse file of 10 GiB fits a
        1 MiB tmpfs, and its archive would otherwise fill the reader's disk.
        """
        rel = validation.workspace_relpath(path or ".")
        cap = policy.stream_allowance(session.spec.limits.workspace_bytes, self._max_members)
        argv = tool_argv(rel, ["tar", "-c", "-f", "-", "."])
        if rel != "." and await self._is_file(session, rel):
            # A single file (issue 21): tar of its folder with the one member "./NAME"; the
            # folder is resolved beneath the workspace by sbx, the name archived as itself.
            parent, _, name = rel.rpartition("/")
            argv = tool_argv(parent or ".", ["tar", "-c", "-f", "-", f"./{name}"])
        stderr = bytearray()
        pending: list[bytes] = []  # joined once per chunk: one copy of each byte
        size = total = 0
        async with self._helper_client.open(session, argv) as stream:
            while (item := await stream.read_joined(CHUNK_BYTES - size)) is not None:
                fd, data = item
                if fd == 2:
                    stderr += data[: STDERR_LIMIT - len(stderr)]
                    continue
                total += len(data)
                if total > cap:
                    raise _too_large(rel, cap)
                pending.append(data)
                size += len(data)
                if size >= CHUNK_BYTES:
                    yield data if len(pending) == 1 else b"".join(pending)
                    pending.clear()
                    size = 0
            code = await stream.wait_exit_code()
        if code != 0:
            raise tool_error("export", "tar", HelperResult(code, b"", bytes(stderr)), rel)
        if pending:
            yield b"".join(pending)

    async def import_(
        self,
        session: Session,
        path: str,
        replace: bool,
        chunks: AsyncIterator[bytes],
        *,
        max_total_bytes: int | None = None,
    ) -> ImportResult:
        """Check every member, unpack into a staging folder, then merge it into place."""
        rel = validation.workspace_relpath(path or ".")
        limits = session.spec.limits
        if rel != ".":
            with contextlib.suppress(AlreadyExists):
                await self._helper(session, ["mkdir", rel, "--parents"], rel)
        existing: set[int] = set() if replace else await self._symlinks_under(session, rel)
        checker = MemberChecker(
            ArchiveLimits(
                max_members=self._max_members,
                max_file_bytes=limits.file_bytes,
                max_total_bytes=max_total_bytes or limits.workspace_bytes,
            ),
            existing_hashes=existing,
        )
        stage = STAGE_PREFIX + secrets.token_hex(6)
        spool = await asyncio.to_thread(self._new_spool) if replace else None
        merged = False
        try:
            await self._helper(session, ["mkdir", stage], stage)
            try:
                members, content = await self._unpack(session, stage, chunks, checker, spool)
            except NoRoom:
                if spool is None:
                    raise
                # The whole archive was checked and is within the cap, but does not fit beside
                # the content it replaces: empty the destination, then unpack again.
                log.info("replace import: emptying %s first to make room", rel)
                await self._remove_stage(session, stage)
                await self._helper(session, ["mkdir", stage], stage)
                await self._helper(session, ["merge", stage, rel, "--replace"], rel)
                await self._helper(session, ["mkdir", stage], stage)
                await asyncio.to_thread(spool.seek, 0)
                members, content = await self._unpack(
                    session, stage, _read_spool(spool), MemberChecker(checker.limits), None
                )
            args = ["merge", stage, rel] + (["--replace"] if replace else [])
            await self._helper(session, args, rel)
            merged = True
        finally:
            if not merged:
                await asyncio.shield(self._remove_stage(session, stage))
            if spool is not None:
                await asyncio.shield(asyncio.to_thread(spool.close))
        return ImportResult(files=members, bytes=content)

    def _new_spool(self) -> BinaryIO:
        self._spool_dir.mkdir(parents=True, exist_ok=True)
        return tempfile.TemporaryFile(dir=self._spool_dir)  # unlinked at once: no leftovers

    async def _symlinks_under(self, session: Session, rel: str) -> set[int]:
        """Symlinks already in the destination, relative to it: nothing may land beneath one.

        Streamed and kept as hashes: a workspace of many entries costs a few bytes each."""
        prefix = "" if rel == "." else rel + "/"
        found: set[int] = set()
        entries = self._files.walk(session, rel)
        async with contextlib.aclosing(entries):
            async for entry in entries:
                if entry.type is FileType.SYMLINK and entry.path.startswith(prefix):
                    found.add(policy.prefix_hashes(entry.path[len(prefix) :])[-1])
        return found

    async def _unpack(
        self,
        session: Session,
        stage: str,
        chunks: AsyncIterator[bytes],
        checker: MemberChecker,
        spool: BinaryIO | None,
    ) -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        inbox, outbox = Inbox(loop, INBOX_BYTES), Outbox(loop, OUTBOX_BYTES)
        done: asyncio.Future[tuple[int, int]] = loop.create_future()
        done.add_done_callback(retrieve)
        argv = tool_argv(stage, ["tar", "-x", "-o", "-f", "-"])
        stderr = bytearray()
        async with self._helper_client.open(session, argv, stdin=True) as stream:
            source, sink = Source(inbox), Sink(outbox, spool)

            async def feed() -> None:
                try:
                    async for data in chunks:
                        await inbox.put(data)
                        if inbox.discarded > MAX_TRAILING_BYTES:
                            break  # more after the end than any tar pads with: stop waiting
                except Exception as exc:  # raised on the thread, where the data stops
                    inbox.end(exc)
                except BaseException:
                    inbox.end(Cancelled())  # never leave the thread waiting for more
                    raise
                else:
                    inbox.end()

            async def pump() -> None:
                while (items := await outbox.take()) is not None:
                    for item in items:
                        if sink.gone:
                            break
                        try:
                            await stream.write(item)
                        except SandboxError:
                            sink.tar_gone()

            def work() -> None:
                try:
                    result: tuple[int, int] | BaseException = check_and_forward(
                        source, sink, checker
                    )
                except BaseException as exc:  # handed to the loop, never lost
                    result = exc
                loop.call_soon_threadsafe(settle, done, result)

            async def read_stderr() -> None:
                stderr.extend((await drain(stream))[1])  # tar -x prints nothing else

            reader = asyncio.create_task(read_stderr())
            writer = asyncio.create_task(pump())
            feeder = asyncio.create_task(feed())
            thread = threading.Thread(target=work, name="sandboxd-import", daemon=True)
            thread.start()
            counts: tuple[int, int] | None = None
            try:
                try:
                    # tar exiting before its input ended (the reader finishing first) means a
                    # write may hang until the engine drops the connection: stop writing.
                    pending: list[asyncio.Future[Any]] = [done, reader]
                    await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    if not done.done():
                        sink.tar_gone()
                        writer.cancel()
                    counts = await asyncio.shield(done)
                    if not writer.done():
                        outbox.close()  # write what is queued, then stop
                        flushing: list[asyncio.Future[Any]] = [writer, reader]
                        await asyncio.wait(flushing, return_when=asyncio.FIRST_COMPLETED)
                        if not writer.done():
                            sink.tar_gone()
                    # Nothing is merged before the client has sent all it meant to: one that
                    # goes away after a complete archive has still cancelled the import.
                    inbox.discard()
                    await feeder
                    if inbox.error is not None:
                        raise inbox.error
                except SinkError:
                    pass  # tar stopped reading: its exit status and stderr say why
                finally:
                    # Whatever happened, let tar see the end of its input and finish, so the
                    # staging folder is quiet before anyone removes it.
                    inbox.cancel()
                    outbox.cancel()
                    for task in (feeder, writer):
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
                    stream.close_stdin()
                    with contextlib.suppress(SandboxError, TimeoutError):
                        await asyncio.wait_for(asyncio.shield(reader), 30)
                code = await stream.wait_exit_code()
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, SandboxError):
                    await reader
                # The thread ends promptly once cancelled; wait so nothing outlives the call.
                await asyncio.shield(join_thread(thread))
        if code != 0 or counts is None or sink.failed or sink.gone:
            raise tool_error("import", "tar", HelperResult(code, b"", bytes(stderr)), stage)
        return counts

    async def _helper(self, session: Session, args: list[str], path: str) -> None:
        await self._helper_client.checked(session, args, path)

    async def _remove_stage(self, session: Session, stage: str) -> None:
        try:
            await self._helper(session, ["remove", stage, "--recursive"], stage)
        except SandboxError as exc:
            log.warning("could not remove import staging folder %s: %s", stage, exc)


async def _read_spool(spool: BinaryIO) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(spool.read, SPOOL_READ_BYTES):
        yield chunk
