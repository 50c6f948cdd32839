"""Tar transfer in and out of a session's workspace.

Export runs `tar -c` inside the container (under the `sbx run` supervisor, whose `--cwd`
check keeps the folder inside /workspace) and forwards its stdout in chunks as it comes:
the archive is never held whole in memory. tar does not follow symlinks when creating.

Import never lets an unchecked byte land where it counts. The client's stream is parsed with
Python's tarfile in streaming mode on a dedicated thread; every member is checked against
SECURITY.md's archive rules and re-emitted, sanitised, to `tar -x` in a fresh staging folder
inside the workspace. Only when the whole archive was good and tar succeeded does
`sbx merge` move the staged entries into place with renameat (never through a symlink).
Any refusal removes the staging folder: the workspace is as it was.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import posixpath
import secrets
import tarfile
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from sandboxd import validation
from sandboxd.engine import Engine, ExecStream
from sandboxd.errors import (
    AlreadyExists,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    ResourceExhausted,
    SandboxError,
)
from sandboxd.files import MAX_LIST_DEPTH, Files
from sandboxd.models import FileType, Session
from sandboxd.profile import HELPER_IN_CONTAINER

log = logging.getLogger(__name__)

# Measured (export of a 48 MiB workspace to a separate client process, median of 5, twice):
# 64 KiB chunks 113-123 MB/s, 256 KiB 149-151, 1 MiB 154-159; under heavy load all within
# noise, 4 MiB worse. Per-message gRPC cost dominates small chunks; 256 KiB gets nearly all
# of the gain at a quarter of 1 MiB's memory per message in flight.
CHUNK_BYTES = 256 * 1024
TAR_BUFSIZE = 256 * 1024  # tarfile's own buffering on both sides of the import thread
OUT_QUEUE_CHUNKS = 8  # sanitised output in flight to the container: 2 MiB at most
STAGE_PREFIX = ".sbx-import-"
DEFAULT_MAX_MEMBERS = 100_000
_STDERR_LIMIT = 8192
_BLOCK = tarfile.BLOCKSIZE

T = TypeVar("T")


@dataclass(frozen=True)
class ArchiveLimits:
    """The caps one import is held to."""

    max_members: int
    max_file_bytes: int
    max_total_bytes: int


@dataclass(frozen=True)
class ImportResult:
    files: int
    bytes: int


def _refuse(reason: str, name: str, why: str) -> InvalidArgument:
    return InvalidArgument(
        f"archive member {name!r}: {why}", reason=reason, metadata={"member": name[:512]}
    )


def normalize_member_name(raw: str) -> str:
    """The member's path relative to the destination; "" for the destination itself.

    Absolute names and any `..` are refused outright rather than stripped: an archive that
    carries them was made to escape, and quietly rewriting it would hide that.
    """
    if "\0" in raw:
        raise _refuse("ARCHIVE_MEMBER_INVALID", raw, "the name contains NUL")
    if raw.startswith("/"):
        raise _refuse("ARCHIVE_ABSOLUTE_PATH", raw, "absolute names are not allowed")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse("ARCHIVE_PATH_TRAVERSAL", raw, "'..' is not allowed in a member name")
    name = "/".join(parts)
    if len(name.encode()) > validation.MAX_PATH_BYTES:
        raise _refuse("ARCHIVE_MEMBER_INVALID", raw[:256], "the name is too long")
    return name


class MemberChecker:
    """Checks members one by one, in archive order, and says what to write for each.

    Keeps just enough state to catch what only order reveals: a member written through a
    symlink the archive itself planted, a hardlink to something that is not an earlier file.
    """

    def __init__(self, limits: ArchiveLimits, existing_symlinks: set[str] | None = None) -> None:
        self.limits = limits
        self._limits = limits
        self._existing = existing_symlinks or set()
        self._symlinks: set[str] = set()
        self._files: set[str] = set()
        self._seen: set[str] = set()
        self._dirs: set[str] = set()
        self._parents: set[str] = set()  # every proper prefix of a seen name: O(1) checks
        self.members = 0
        self.total_bytes = 0

    def _through_symlink(self, name: str) -> str | None:
        parts = name.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in self._symlinks or prefix in self._existing:
                return prefix
        return None

    def check(self, info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        """A sanitised copy of `info` to write, None to skip it (the root entry)."""
        raw = info.name
        name = normalize_member_name(raw)
        self.members += 1
        if self.members > self._limits.max_members:
            raise _refuse(
                "ARCHIVE_TOO_MANY_MEMBERS",
                raw,
                f"the archive has more than {self._limits.max_members} members",
            )
        if not name:
            if not info.isdir():
                raise _refuse("ARCHIVE_MEMBER_INVALID", raw, "the root must be a directory")
            return None
        link = self._through_symlink(name)
        if link is not None:
            raise _refuse(
                "ARCHIVE_THROUGH_SYMLINK", raw, f"it would be written through the symlink {link!r}"
            )
        if info.type in (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE):
            raise _refuse("ARCHIVE_SPECIAL_FILE", raw, "devices, fifos and sockets are not allowed")
        if info.sparse is not None or info.type == tarfile.GNUTYPE_SPARSE:
            raise _refuse("ARCHIVE_MEMBER_UNSUPPORTED", raw, "sparse members are not allowed")
        out = tarfile.TarInfo(name)
        out.mtime = info.mtime
        out.mode = info.mode & 0o777  # setuid, setgid and sticky bits are stripped
        if info.isdir():
            if name in self._seen and name not in self._dirs:
                raise _refuse("ARCHIVE_DUPLICATE_MEMBER", raw, "the name appears twice")
            out.type = tarfile.DIRTYPE
        elif info.issym():
            self._check_link_target(raw, name, info.linkname, symbolic=True)
            self._claim(raw, name)
            self._symlinks.add(name)
            out.type = tarfile.SYMTYPE
            out.linkname = info.linkname
        elif info.islnk():
            target = self._check_link_target(raw, name, info.linkname, symbolic=False)
            self._claim(raw, name)
            out.type = tarfile.LNKTYPE
            out.linkname = target
        elif info.isreg():
            if info.size > self._limits.max_file_bytes:
                raise ResourceExhausted(
                    f"archive member {raw!r} is {info.size} bytes, over the file cap of "
                    f"{self._limits.max_file_bytes}",
                    reason="FILE_TOO_LARGE",
                    metadata={"member": raw[:512], "limit": str(self._limits.max_file_bytes)},
                )
            self.total_bytes += info.size
            if self.total_bytes > self._limits.max_total_bytes:
                raise ResourceExhausted(
                    f"the archive holds more than the workspace cap of "
                    f"{self._limits.max_total_bytes} bytes",
                    reason="WORKSPACE_FULL",
                    metadata={"limit": str(self._limits.max_total_bytes)},
                )
            self._claim(raw, name)
            self._files.add(name)
            out.type = tarfile.REGTYPE
            out.size = info.size
        else:
            raise _refuse("ARCHIVE_MEMBER_UNSUPPORTED", raw, f"member type {info.type!r}")
        self._seen.add(name)
        if out.type == tarfile.DIRTYPE:
            self._dirs.add(name)
        parts = name.split("/")
        self._parents.update("/".join(parts[:i]) for i in range(1, len(parts)))
        return out

    def _claim(self, raw: str, name: str) -> None:
        if name in self._seen:
            raise _refuse("ARCHIVE_DUPLICATE_MEMBER", raw, "the name appears twice")
        if name in self._parents:
            raise _refuse("ARCHIVE_DUPLICATE_MEMBER", raw, "a directory of that name came earlier")

    def _check_link_target(self, raw: str, name: str, target: str, *, symbolic: bool) -> str:
        if not target or "\0" in target:
            raise _refuse("ARCHIVE_LINK_OUTSIDE", raw, "the link target is empty or has NUL")
        if target.startswith("/"):
            raise _refuse("ARCHIVE_LINK_OUTSIDE", raw, f"the link target {target!r} is absolute")
        base = posixpath.dirname(name) if symbolic else ""
        resolved = posixpath.normpath(posixpath.join(base, target))
        if resolved == ".." or resolved.startswith("../"):
            raise _refuse(
                "ARCHIVE_LINK_OUTSIDE", raw, f"the link target {target!r} leaves the destination"
            )
        if symbolic:
            return target
        resolved = normalize_member_name(resolved)
        if self._through_symlink(resolved + "/x") is not None or resolved in self._symlinks:
            raise _refuse("ARCHIVE_LINK_OUTSIDE", raw, "a hardlink to a symlink")
        if resolved not in self._files:
            raise _refuse(
                "ARCHIVE_LINK_OUTSIDE",
                raw,
                f"the hardlink target {target!r} is not an earlier file",
            )
        return resolved


class _Bridge:
    """Lets the import thread pull from and push to the event loop, one awaitable at a time.

    The thread blocks on each step, so backpressure is natural and nothing queues up; cancel()
    wakes the thread from whatever it waits on.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._current: concurrent.futures.Future[Any] | None = None
        self._current_tag = ""
        self.cancelled = False

    def call(self, factory: Callable[[], Awaitable[T]], tag: str = "") -> T:
        async def runner() -> T:
            return await factory()

        with self._lock:
            if self.cancelled:
                raise _Cancelled
            fut = asyncio.run_coroutine_threadsafe(runner(), self._loop)
            self._current, self._current_tag = fut, tag
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            raise _Cancelled from None

    def interrupt(self, tag: str) -> None:
        """Cancel the step in flight if it is of this kind (a write to a tar that is gone)."""
        with self._lock:
            if self._current is not None and self._current_tag == tag:
                self._current.cancel()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._current is not None:
                self._current.cancel()


class _Cancelled(Exception):
    """The import was abandoned by the loop side."""


class _SinkError(Exception):
    """Writing to the container failed; not the archive's fault."""


class _Source:
    """A file-like view of the client's chunks, for tarfile's `r|` mode.

    Remembers the last few blocks so that, when tarfile stops, we can tell a proper end (a
    zero block) from a truncated or garbage tail, which tarfile's stream mode takes silently.
    """

    def __init__(self, bridge: _Bridge, chunks: AsyncIterator[bytes]) -> None:
        self._bridge = bridge
        self._chunks = chunks
        self._buf = bytearray()
        self._eof = False
        self.position = 0  # bytes handed to tarfile so far
        self._tail = bytearray()  # the last bytes handed out
        self._tail_start = 0

    def _next(self) -> bytes | None:
        async def pull() -> bytes | None:
            try:
                return await anext(self._chunks)
            except StopAsyncIteration:
                return None

        return self._bridge.call(pull)

    def read(self, n: int = -1) -> bytes:
        while not self._eof and (n < 0 or len(self._buf) < n):
            data = self._next()
            if data is None:
                self._eof = True
            else:
                self._buf += data
        if n < 0:
            n = len(self._buf)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        self._remember(out)
        return out

    def _remember(self, data: bytes) -> None:
        self._tail += data
        self.position += len(data)
        keep = 2 * TAR_BUFSIZE + 2 * _BLOCK
        if len(self._tail) > keep:
            drop = len(self._tail) - keep
            del self._tail[:drop]
            self._tail_start += drop

    def block_at(self, offset: int) -> bytes | None:
        """The 512 bytes at `offset` if they were read; fewer if the stream ended there."""
        if offset < self._tail_start:
            return None
        if offset + _BLOCK > self.position:
            self.read(offset + _BLOCK - self.position)
        start = offset - self._tail_start
        return bytes(self._tail[start : start + _BLOCK])


class _Sink:
    """A file-like that hands tarfile's output to the loop, where a task writes it to the
    container's `tar -x`; the bounded queue between them lets parsing and writing overlap.

    With a spool (a replace), the sanitised archive is also kept in a server-side temporary
    file, and a tar that gives up (no room beside the old content) does not stop the check:
    the import can then empty the destination and unpack again from the spool.
    """

    def __init__(
        self, bridge: _Bridge, queue: asyncio.Queue[bytes | None], spool: BinaryIO | None
    ) -> None:
        self._bridge = bridge
        self._queue = queue
        self._spool = spool
        self.failed = False
        self._gone = threading.Event()

    @property
    def gone(self) -> bool:
        return self._gone.is_set()

    def tar_gone(self) -> None:
        """tar exited or its stdin broke before the input ended: stop feeding it."""
        self._gone.set()
        self._bridge.interrupt("write")

    def write(self, data: bytes) -> int:
        payload = bytes(data)
        if self._spool is not None:
            self._spool.write(payload)  # on the import thread: blocking here is fine
        if not self.failed:
            try:
                if self._gone.is_set():
                    raise _SinkError("tar exited early")
                self._bridge.call(lambda: self._queue.put(payload), "write")
            except (_SinkError, _Cancelled) as exc:
                if isinstance(exc, _Cancelled) and not self._gone.is_set():
                    raise
                if self._spool is None:
                    raise _SinkError(str(exc)) from exc
                self.failed = True
        return len(payload)


class _NoRoom(ResourceExhausted):
    """tar ran out of space in the workspace (as opposed to the archive being over the cap)."""


def check_and_forward(
    source: _Source, sink: _Sink | None, checker: MemberChecker
) -> tuple[int, int]:
    """Runs on the import thread: parse, check, re-emit. Returns (members, content bytes)."""
    written = 0
    try:
        src = tarfile.open(fileobj=source, mode="r|", bufsize=TAR_BUFSIZE)  # type: ignore[call-overload]
    except tarfile.ReadError as exc:
        raise InvalidArgument(
            f"the data is not a tar archive ({exc})", reason="ARCHIVE_INVALID"
        ) from None
    out = (
        tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT, bufsize=TAR_BUFSIZE)  # type: ignore[call-overload]
        if sink is not None
        else None
    )
    if out is not None:
        out.copybufsize = TAR_BUFSIZE  # 16 KiB reads from the stream copy its buffer each time
    try:
        while True:
            try:
                info = src.next()
            except tarfile.TarError as exc:
                raise InvalidArgument(
                    f"the archive is damaged ({exc})", reason="ARCHIVE_INVALID"
                ) from None
            if info is None:
                break
            # tarfile keeps every TarInfo it has seen, even streaming: 100 000 members would
            # be tens of MiB. Nothing here looks back, so let them go.
            src.members.clear()
            if out is not None:
                out.members.clear()
            clean = checker.check(info)
            if clean is None:
                continue
            data = src.extractfile(info) if clean.isreg() else None
            if out is not None:
                try:
                    out.addfile(clean, data)
                except (OSError, tarfile.TarError):
                    raise _truncated(info.name) from None
            elif data is not None:
                while data.read(TAR_BUFSIZE):
                    pass
                if data.tell() != info.size:  # pragma: no cover - tarfile raises first
                    raise _truncated(info.name)
            if clean.isreg():
                written += clean.size
        _check_end(source, src.offset)
        if out is not None:
            out.close()
    finally:
        src.close()
    return checker.members, written


def _truncated(name: str) -> InvalidArgument:
    return InvalidArgument(
        f"the archive ends inside member {name!r} (truncated, or the header lies about its size)",
        reason="ARCHIVE_TRUNCATED",
        metadata={"member": name[:512]},
    )


def _check_end(source: _Source, offset: int) -> None:
    """tarfile's stream mode ends quietly on a missing or garbage header: refuse both."""
    block = source.block_at(offset)
    if block is None or len(block) < _BLOCK:
        raise InvalidArgument(
            "the archive is truncated (no end-of-archive marker)", reason="ARCHIVE_TRUNCATED"
        )
    if block.count(0) != _BLOCK:
        raise InvalidArgument(
            "the archive holds data that is not a tar header (damaged, or a member lies about "
            "its size)",
            reason="ARCHIVE_INVALID",
        )


class ArchiveIO:
    """Export and import through exec; holds no per-call state."""

    def __init__(
        self,
        engine: Engine,
        files: Files,
        max_members: int = DEFAULT_MAX_MEMBERS,
        spool_dir: Path | None = None,
    ) -> None:
        self._engine = engine
        self._files = files
        self._max_members = max_members
        self._spool_dir = spool_dir or Path(tempfile.gettempdir())

    async def export(self, session: Session, path: str) -> AsyncIterator[bytes]:
        """Yields the tar of `path` in chunks as tar writes it; raises if tar fails."""
        rel = validation.workspace_relpath(path or ".")
        argv = [HELPER_IN_CONTAINER, "run", "--cwd", rel, "--", "tar", "-c", "-f", "-", "."]
        stderr = bytearray()
        pending = bytearray()
        async with self._engine.exec(session.container_id, argv, user=session.spec.user) as stream:
            while (item := await stream.read()) is not None:
                fd, data = item
                if fd == 2:
                    stderr += data[: _STDERR_LIMIT - len(stderr)]
                    continue
                pending += data
                if len(pending) >= CHUNK_BYTES:
                    yield bytes(pending)
                    pending.clear()
            code = await _exit_code(stream)
        if code != 0:
            raise _tar_error("export", code, stderr, rel)
        if pending:
            yield bytes(pending)

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
        existing = set() if replace else await self._symlinks_under(session, rel)
        checker = MemberChecker(
            ArchiveLimits(
                max_members=self._max_members,
                max_file_bytes=limits.file_bytes,
                max_total_bytes=max_total_bytes or limits.workspace_bytes,
            ),
            existing_symlinks=existing,
        )
        stage = STAGE_PREFIX + secrets.token_hex(6)
        spool = await asyncio.to_thread(self._new_spool) if replace else None
        merged = False
        try:
            await self._helper(session, ["mkdir", stage], stage)
            try:
                members, content = await self._unpack(session, stage, chunks, checker, spool)
            except _NoRoom:
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

    async def _symlinks_under(self, session: Session, rel: str) -> set[str]:
        """Symlinks already in the destination, relative to it: nothing may land beneath one."""
        entries = await self._files.list_dir(session, rel, MAX_LIST_DEPTH)
        prefix = "" if rel == "." else rel + "/"
        return {
            e.path[len(prefix) :]
            for e in entries
            if e.type is FileType.SYMLINK and e.path.startswith(prefix)
        }

    async def _unpack(
        self,
        session: Session,
        stage: str,
        chunks: AsyncIterator[bytes],
        checker: MemberChecker,
        spool: BinaryIO | None,
    ) -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        bridge = _Bridge(loop)
        done: asyncio.Future[tuple[int, int]] = loop.create_future()
        done.add_done_callback(_retrieve)
        argv = [HELPER_IN_CONTAINER, "run", "--cwd", stage, "--", "tar", "-x", "-o", "-f", "-"]
        stderr = bytearray()
        async with self._engine.exec(
            session.container_id, argv, user=session.spec.user, stdin=True
        ) as stream:
            outq: asyncio.Queue[bytes | None] = asyncio.Queue(OUT_QUEUE_CHUNKS)
            source, sink = _Source(bridge, chunks), _Sink(bridge, outq, spool)

            async def pump() -> None:
                while (item := await outq.get()) is not None:
                    if sink.gone:
                        continue  # keep draining so the import thread never blocks
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
                loop.call_soon_threadsafe(_settle, done, result)

            async def drain() -> None:
                while (item := await stream.read()) is not None:
                    if item[0] == 2:
                        stderr.extend(item[1][: _STDERR_LIMIT - len(stderr)])

            reader = asyncio.create_task(drain())
            writer = asyncio.create_task(pump())
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
                        await outq.put(None)  # flush what is queued, then stop
                        flushing: list[asyncio.Future[Any]] = [writer, reader]
                        await asyncio.wait(flushing, return_when=asyncio.FIRST_COMPLETED)
                        if not writer.done():
                            sink.tar_gone()
                except _SinkError:
                    pass  # tar stopped reading: its exit status and stderr say why
                finally:
                    # Whatever happened, let tar see the end of its input and finish, so the
                    # staging folder is quiet before anyone removes it.
                    bridge.cancel()
                    writer.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await writer
                    stream.close_stdin()
                    with contextlib.suppress(SandboxError, TimeoutError):
                        await asyncio.wait_for(asyncio.shield(reader), 30)
                code = await _exit_code(stream)
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, SandboxError):
                    await reader
                # The thread ends promptly once cancelled; wait so nothing outlives the call.
                await asyncio.shield(_join(thread))
        if code != 0 or counts is None or sink.failed or sink.gone:
            raise _tar_error("import", code, stderr, stage)
        return counts

    async def _helper(self, session: Session, args: list[str], path: str) -> None:
        await self._files.helper_checked(session, args, path)

    async def _remove_stage(self, session: Session, stage: str) -> None:
        try:
            await self._helper(session, ["remove", stage, "--recursive"], stage)
        except SandboxError as exc:
            log.warning("could not remove import staging folder %s: %s", stage, exc)


async def _read_spool(spool: BinaryIO) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(spool.read, TAR_BUFSIZE):
        yield chunk


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark an outcome nobody awaits any more (the call was cancelled) as seen."""
    if not fut.cancelled():
        fut.exception()


def _settle(fut: asyncio.Future[T], result: T | BaseException) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


async def _join(thread: threading.Thread) -> None:
    while thread.is_alive():
        await asyncio.sleep(0.01)


async def _exit_code(stream: ExecStream) -> int:
    for delay in (0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0):
        if delay:
            await asyncio.sleep(delay)
        code = await stream.exit_code()
        if code is not None:
            return code
    return -1


def _tar_error(what: str, code: int, stderr: bytes | bytearray, path: str) -> SandboxError:
    text = bytes(stderr).decode(errors="replace").strip()
    low = text.lower()
    meta = {"path": path}
    if "no space" in low or "quota" in low:
        return _NoRoom(f"{what}: the workspace is full", reason="WORKSPACE_FULL", metadata=meta)
    if code in (126, 127) and text.startswith("{"):
        if "ESCAPE" in text:
            return InvalidArgument(
                f"{path}: resolves outside /workspace",
                reason="PATH_OUTSIDE_WORKSPACE",
                metadata=meta,
            )
        if "ENOENT" in text or "ENOTDIR" in text:
            return FailedPrecondition(
                f"{what}: {path} is not a folder in the workspace (or tar is missing from the "
                "image)",
                reason="NOT_A_DIRECTORY",
                metadata=meta,
            )
    return Internal(f"{what}: tar exited {code}: {text[:500]}")
