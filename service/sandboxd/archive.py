"""Tar transfer in and out of a session's workspace.

Export runs `tar -c` inside the container (under the `sbx run` supervisor, whose `--cwd`
check keeps the folder inside /workspace) and forwards its stdout in chunks as it comes:
the archive is never held whole in memory. tar does not follow symlinks when creating.

Import never lets an unchecked byte land where it counts. The client's stream is parsed with
Python's tarfile, forward only as it streams, on a dedicated thread; every member is checked
against SECURITY.md's archive rules and re-emitted, sanitised, to `tar -x` in a fresh staging
folder inside the workspace. Only when the whole archive was good and tar succeeded does
`sbx merge` move the staged entries into place with renameat (never through a symlink).
Any refusal removes the staging folder: the workspace is as it was.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import posixpath
import secrets
import tarfile
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from sandboxd import validation
from sandboxd.engine import Engine
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
INBOX_BYTES = 1024 * 1024  # client chunks read ahead for the import thread (one always fits)
OUTBOX_BYTES = 1024 * 1024  # sanitised output queued for the container, plus a batch in writing
OUT_BATCH = 256 * 1024  # the import thread hands its output over in batches of this size
MAX_HEADER_BYTES = 4 * 1024 * 1024  # one PAX or GNU extension record, read into memory
MAX_TRAILING_BYTES = 1024 * 1024  # after the end-of-archive marker (tar pads to 10 KiB records)
SPOOL_READ_BYTES = 256 * 1024
STAGE_PREFIX = ".sbx-import-"
DEFAULT_MAX_MEMBERS = 100_000
_STDERR_LIMIT = 8192
_BLOCK = tarfile.BLOCKSIZE
_ZEROS = bytes(_BLOCK)
_TAIL_BYTES = 4 * _BLOCK  # what the import's source remembers for the end-of-archive check

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


class _Cancelled(Exception):
    """The import was abandoned by the loop side."""


class _SinkError(Exception):
    """Writing to the container failed; not the archive's fault."""


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Inbox:
    """The client's chunks on their way from the loop (a feeder task) to the import thread.

    Bounded by bytes (one chunk always fits, however large). Neither side makes a round trip
    per chunk: the thread takes what is there and blocks only when nothing is; the feeder is
    woken from the thread only when it waited for room, once half the room is free again.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._loop = loop
        self._limit = limit
        self._cond = threading.Condition()
        self._items: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._ended = False
        self._error: BaseException | None = None
        self._cancelled = False
        self._discard = False
        self._room: asyncio.Future[None] | None = None
        self.discarded = 0  # bytes dropped after the archive's end

    async def put(self, data: bytes) -> None:
        """Loop side: queue a chunk, waiting while the inbox is full."""
        while True:
            with self._cond:
                if self._discard:
                    self.discarded += len(data)
                    return
                if self._cancelled:
                    return
                if self._size < self._limit:
                    self._items.append(data)
                    self._size += len(data)
                    self._cond.notify()
                    return
                room = self._room = self._loop.create_future()
            await room

    def end(self, error: BaseException | None = None) -> None:
        """Loop side: no more chunks; with `error`, the thread raises it once it gets there."""
        with self._cond:
            self._ended = True
            self._error = error
            self._cond.notify()

    @property
    def error(self) -> BaseException | None:
        return self._error

    def discard(self) -> None:
        """Loop side, once the thread is done: drop what comes after the archive's end."""
        with self._cond:
            self._discard = True
            self._items.clear()
            self._size = 0
            if self._room is not None:
                room, self._room = self._room, None
                _wake(room)

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def get(self) -> bytes | None:
        """Thread side: the next chunk, None at the end of the client's stream."""
        with self._cond:
            while not self._items and not self._cancelled:
                if self._ended:
                    if self._error is not None:
                        raise self._error
                    return None
                self._cond.wait()
            if self._cancelled:
                raise _Cancelled
            data = self._items.popleft()
            self._size -= len(data)
            if self._room is not None and self._size <= self._limit // 2:
                room, self._room = self._room, None
                self._loop.call_soon_threadsafe(_wake, room)
            return data


class _Outbox:
    """Sanitised output on its way from the import thread to the loop's writer task.

    Bounded by bytes: the thread blocks while it is full (backpressure from the container's
    stdin); the writer takes everything queued at once and is woken only when it waited.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._loop = loop
        self._limit = limit
        self._cond = threading.Condition()
        self._items: list[bytes] = []
        self._size = 0
        self._closed = False  # no more output: the writer ends once it has written the rest
        self._gone = False  # the writer stopped taking (tar is gone)
        self._cancelled = False
        self._waiter: asyncio.Future[None] | None = None

    def put(self, data: bytes) -> None:
        """Thread side: queue output, blocking while full; _SinkError once tar is gone."""
        with self._cond:
            while self._size >= self._limit and not (self._gone or self._cancelled):
                self._cond.wait()
            if self._cancelled and not self._gone:
                raise _Cancelled
            if self._gone:
                raise _SinkError("tar exited early")
            self._items.append(data)
            self._size += len(data)
            if self._waiter is not None:
                waiter, self._waiter = self._waiter, None
                self._loop.call_soon_threadsafe(_wake, waiter)

    async def take(self) -> list[bytes] | None:
        """Loop side: everything queued (waiting for some), None once closed and empty."""
        while True:
            with self._cond:
                if self._items:
                    items, self._items, self._size = self._items, [], 0
                    self._cond.notify()
                    return items
                if self._closed:
                    return None
                waiter = self._waiter = self._loop.create_future()
            await waiter

    def close(self) -> None:
        """Loop side: the thread is done; the writer stops once the queue is empty."""
        with self._cond:
            self._closed = True
            if self._waiter is not None:
                waiter, self._waiter = self._waiter, None
                _wake(waiter)

    def gone(self) -> None:
        """tar exited or its stdin broke: the thread's next write fails at once."""
        with self._cond:
            self._gone = True
            self._items, self._size = [], 0
            self._cond.notify_all()

    @property
    def is_gone(self) -> bool:
        return self._gone

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()


class _Source:
    """A forward-only file-like view of the client's chunks, for tarfile's `r:` mode.

    tarfile reads only headers through read(); member data is passed on by the import
    thread itself as views of the chunks as they came (read_view), never copied on the way.
    Remembers the last bytes handed out so that, when tarfile stops, we can tell a proper end
    (a zero block) from a truncated or garbage tail, which tarfile ends on silently.
    """

    def __init__(self, inbox: _Inbox) -> None:
        self._inbox = inbox
        self._chunk = b""
        self._at = 0  # read position in self._chunk
        self._eof = False
        self.position = 0  # bytes handed out (or skipped) so far
        self._tail = b""  # the last bytes handed out, ending at self.position

    def _fill(self) -> bool:
        """Make the current chunk non-empty; False at the end of the stream."""
        while self._at >= len(self._chunk):
            if self._eof:
                return False
            data = self._inbox.get()
            if data is None:
                self._eof = True
                return False
            self._chunk, self._at = data, 0
        return True

    def read_view(self, n: int) -> memoryview:
        """Up to `n` bytes (fewer at a chunk's end, none at the stream's end), not copied."""
        if n <= 0 or not self._fill():
            return memoryview(b"")
        end = min(len(self._chunk), self._at + n)
        view = memoryview(self._chunk)[self._at : end]
        self._at = end
        self.position += len(view)
        self._tail = b""  # member data is never looked back at: only what read() handed out
        return view

    def read(self, n: int = -1) -> bytes:
        if n > MAX_HEADER_BYTES:
            # Only tarfile calls this, for headers and PAX/GNU extension records: a record
            # this large is not a real archive's and would otherwise be held in memory.
            raise InvalidArgument(
                f"the archive has a header record of {n} bytes", reason="ARCHIVE_INVALID"
            )
        parts: list[bytes] = []
        want = n
        while want != 0 and self._fill():
            end = len(self._chunk) if want < 0 else min(len(self._chunk), self._at + want)
            parts.append(self._chunk[self._at : end])
            want -= 0 if want < 0 else end - self._at
            self._at = end
        out = parts[0] if len(parts) == 1 else b"".join(parts)
        self._remember(out)
        return out

    def _remember(self, data: bytes) -> None:
        self.position += len(data)
        if len(data) >= _TAIL_BYTES:
            self._tail = data[-_TAIL_BYTES:]
        else:
            self._tail = (self._tail + data)[-_TAIL_BYTES:]

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = 0) -> int:
        """Forward only (tarfile skips the padding after a member's data this way)."""
        if whence != 0 or offset < self.position:
            raise OSError("the archive stream cannot seek backwards")
        while self.position < offset and self._fill():
            step = min(len(self._chunk) - self._at, offset - self.position)
            self._at += step
            self.position += step
            self._tail = b""
        return self.position

    def block_at(self, offset: int) -> bytes | None:
        """The 512 bytes at `offset` if they were read; fewer if the stream ended there."""
        if offset + _BLOCK > self.position:
            if offset > self.position:
                return None
            self.read(offset + _BLOCK - self.position)
        start = len(self._tail) - (self.position - offset)
        if start < 0:
            return None
        return self._tail[start : start + _BLOCK]


class _Sink:
    """Collects the sanitised archive on the import thread and hands it to the outbox in
    batches of OUT_BATCH bytes, for the loop's writer task to send to the container's `tar -x`.

    With a spool (a replace), the sanitised archive is also kept in a server-side temporary
    file, and a tar that gives up (no room beside the old content) does not stop the check:
    the import can then empty the destination and unpack again from the spool.
    """

    def __init__(self, outbox: _Outbox, spool: BinaryIO | None) -> None:
        self._outbox = outbox
        self._spool = spool
        self.failed = False
        self._parts: list[bytes | memoryview] = []
        self._size = 0
        self.written = 0  # bytes of sanitised archive so far

    @property
    def gone(self) -> bool:
        return self._outbox.is_gone

    def tar_gone(self) -> None:
        """tar exited or its stdin broke before the input ended: stop feeding it."""
        self._outbox.gone()

    def write(self, data: bytes | memoryview) -> None:
        self._parts.append(data)
        self._size += len(data)
        self.written += len(data)
        if self._size >= OUT_BATCH:
            self.flush()

    def flush(self) -> None:
        if not self._parts:
            return
        payload = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        payload = bytes(payload) if isinstance(payload, memoryview) else payload
        self._parts, self._size = [], 0
        if self._spool is not None:
            self._spool.write(payload)  # on the import thread: blocking here is fine
        if not self.failed:
            try:
                self._outbox.put(payload)
            except (_SinkError, _Cancelled) as exc:
                if isinstance(exc, _Cancelled) and not self.gone:
                    raise
                if self._spool is None:
                    raise _SinkError(str(exc)) from exc
                self.failed = True


class _NoRoom(ResourceExhausted):
    """tar ran out of space in the workspace (as opposed to the archive being over the cap)."""


def check_and_forward(
    source: _Source, sink: _Sink | None, checker: MemberChecker
) -> tuple[int, int]:
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
            f"the data is not a tar archive ({exc})", reason="ARCHIVE_INVALID"
        ) from None
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
            # tarfile keeps every TarInfo it has seen: 100 000 members would be tens of MiB.
            # Nothing here looks back, so let them go.
            src.members.clear()
            clean = checker.check(info)
            if clean is None:
                continue
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
                if sink is not None and clean.size % _BLOCK:
                    sink.write(_ZEROS[: _BLOCK - clean.size % _BLOCK])
                written += clean.size
        _check_end(source, src.offset)
        if sink is not None:
            # tarfile's close() in `w` mode: two zero blocks, then zeros to a whole record.
            end = 2 * _BLOCK + (-(sink.written + 2 * _BLOCK)) % tarfile.RECORDSIZE
            sink.write(bytes(end))
            sink.flush()
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
        pending: list[bytes] = []  # joined once per chunk: one copy of each byte
        size = 0
        async with self._engine.exec(session.container_id, argv, user=session.spec.user) as stream:
            while (item := await stream.read_joined(CHUNK_BYTES - size)) is not None:
                fd, data = item
                if fd == 2:
                    stderr += data[: _STDERR_LIMIT - len(stderr)]
                    continue
                pending.append(data)
                size += len(data)
                if size >= CHUNK_BYTES:
                    yield data if len(pending) == 1 else b"".join(pending)
                    pending.clear()
                    size = 0
            code = await stream.wait_exit_code()
        if code != 0:
            raise _tar_error("export", code, stderr, rel)
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
        inbox, outbox = _Inbox(loop, INBOX_BYTES), _Outbox(loop, OUTBOX_BYTES)
        done: asyncio.Future[tuple[int, int]] = loop.create_future()
        done.add_done_callback(_retrieve)
        argv = [HELPER_IN_CONTAINER, "run", "--cwd", stage, "--", "tar", "-x", "-o", "-f", "-"]
        stderr = bytearray()
        async with self._engine.exec(
            session.container_id, argv, user=session.spec.user, stdin=True
        ) as stream:
            source, sink = _Source(inbox), _Sink(outbox, spool)

            async def feed() -> None:
                try:
                    async for data in chunks:
                        await inbox.put(data)
                        if inbox.discarded > MAX_TRAILING_BYTES:
                            break  # more after the end than any tar pads with: stop waiting
                except Exception as exc:  # raised on the thread, where the data stops
                    inbox.end(exc)
                except BaseException:
                    inbox.end(_Cancelled())  # never leave the thread waiting for more
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
                loop.call_soon_threadsafe(_settle, done, result)

            async def drain() -> None:
                while (item := await stream.read()) is not None:
                    if item[0] == 2:
                        stderr.extend(item[1][: _STDERR_LIMIT - len(stderr)])

            reader = asyncio.create_task(drain())
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
                except _SinkError:
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
    while chunk := await asyncio.to_thread(spool.read, SPOOL_READ_BYTES):
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
