"""File operations confined to /workspace.

The server validates paths lexically; the `sbx` helper then resolves them inside the
container with openat2(RESOLVE_BENEATH), so a symlink planted by a command can never lead a
read, write or listing out of the workspace, whatever races the command runs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any

from sandboxd import domain_events, validation
from sandboxd.budget import ByteBudget
from sandboxd.commands import SandboxCommands
from sandboxd.errors import Internal, InvalidArgument, ResourceExhausted
from sandboxd.helper_client import HelperClient, HelperResult, StdoutOverflow
from sandboxd.models import FileContent, FileInfo, FileType, Session
from sandboxd.reasons import Reason

MAX_LIST_DEPTH = 32
# Defaults of the settings `listing_bytes` and `file_buffer_bytes`. The most a walk may print
# (JSON lines, longer than the entries they become): ListDir pages are cut from the whole walk,
# so a walk past this stops at once rather than after all the work.
LISTING_BYTES = 8 * 1024 * 1024
# What one session's listings and reads may hold in server memory at once.
SESSION_BUFFER_BYTES = 32 * 1024 * 1024

_TYPES = {
    "file": FileType.FILE,
    "dir": FileType.DIRECTORY,
    "symlink": FileType.SYMLINK,
    "other": FileType.OTHER,
}


def _file_info(record: dict[str, Any]) -> FileInfo:
    return FileInfo(
        path=str(record["path"]),
        name=str(record["name"]),
        type=_TYPES.get(str(record["type"]), FileType.OTHER),
        size=int(record["size"]),
        mode=int(record["mode"]),
        modified_ns=int(record["mtime_ns"]),
        symlink_target=str(record.get("target", "")),
    )


def parse_records(stdout: bytes) -> list[FileInfo]:
    try:
        return [_file_info(json.loads(line)) for line in stdout.splitlines() if line.strip()]
    except (ValueError, KeyError, TypeError) as exc:
        raise Internal(f"file helper printed an unexpected record: {exc}") from exc


class Files:
    def __init__(
        self,
        commands: SandboxCommands,
        helper: HelperClient | None = None,
        buffers: ByteBudget | None = None,
        listing_bytes: int = LISTING_BYTES,
        observer: domain_events.Observer = domain_events.SILENT,  # writes, folders, removals
    ) -> None:
        self._observer = observer
        self.helper = helper or HelperClient(commands)
        self.buffers = buffers or ByteBudget(SESSION_BUFFER_BYTES)
        self._listing_bytes = listing_bytes

    async def _checked(
        self, session: Session, args: list[str], path: str, **kw: Any
    ) -> HelperResult:
        return await self.helper.checked(session, args, path, **kw)

    async def read(self, session: Session, path: str, room: int | None = None) -> FileContent:
        """The file whole, if it is at most the session's file cap and `room` bytes (what the
        caller takes in one reply): a larger one is refused before it is read, one over
        `room` with REPLY_TOO_LARGE naming ReadFileStream, which sends any file in chunks."""
        rel = validation.workspace_relpath(path, allow_root=False)
        cap = session.spec.limits.file_bytes
        by_room = room is not None and room < cap
        if room is not None:
            cap = min(cap, room)
        async with self.buffers.hold(session.session_id, cap + 4096, "ReadFile"):
            try:
                result = await self._checked(
                    session, ["read", rel, str(cap)], rel, max_stdout=cap + 4096
                )
            except ResourceExhausted as exc:
                if not by_room or exc.reason != Reason.FILE_TOO_LARGE:
                    raise
                raise ResourceExhausted(
                    f"{rel}: the file is larger than the {cap} bytes one ReadFile reply may "
                    "carry to this caller (max_reply_bytes; 4 MiB when unset): read it with "
                    "ReadFileStream, which sends it in chunks",
                    reason=Reason.REPLY_TOO_LARGE,
                    metadata={"path": rel, "limit": str(cap), "rpc": "ReadFileStream"},
                ) from None
        header, sep, content = result.stdout.partition(b"\n")
        try:
            meta = json.loads(header)
            size, mode = int(meta["size"]), int(meta["mode"])
        except (ValueError, KeyError, TypeError) as exc:
            raise Internal(f"file helper printed an unexpected header: {exc}") from exc
        return FileContent(content=content, mode=mode, size=size)

    async def write(
        self, session: Session, path: str, content: bytes, mode: int, make_parents: bool
    ) -> FileInfo:
        rel = validation.workspace_relpath(path, allow_root=False)
        asked, mode = mode, validation.validate_file_mode(mode, default=0o644)
        cap = session.spec.limits.file_bytes
        if len(content) > cap:
            raise ResourceExhausted(
                f"{rel}: {len(content)} bytes is over the file cap of {cap}",
                reason=Reason.FILE_TOO_LARGE,
                metadata={"path": rel, "limit": str(cap)},
            )
        args = ["write", rel, format(mode, "o"), str(cap)] + (["--parents"] if make_parents else [])
        result = await self._checked(session, args, rel, stdin=content, max_stdout=64 * 1024)
        info = parse_records(result.stdout)[0]
        self._observer.emit(
            domain_events.FileWritten(
                session.tenant, session.session_id, path, len(content), asked, info.size
            )
        )
        return info

    async def stat(self, session: Session, path: str) -> FileInfo:
        rel = validation.workspace_relpath(path or ".")
        result = await self._checked(session, ["stat", rel], rel, max_stdout=64 * 1024)
        return parse_records(result.stdout)[0]

    async def list_dir(self, session: Session, path: str, depth: int) -> list[FileInfo]:
        rel = validation.workspace_relpath(path or ".")
        if depth < 0 or depth > MAX_LIST_DEPTH:
            raise InvalidArgument(
                f"depth must be between 0 and {MAX_LIST_DEPTH}", reason=Reason.INVALID_DEPTH
            )
        async with self.buffers.hold(session.session_id, self._listing_bytes, "ListDir"):
            try:
                result = await self._checked(
                    session, ["list", rel, str(max(depth, 1))], rel, max_stdout=self._listing_bytes
                )
            except StdoutOverflow:
                raise ResourceExhausted(
                    f"the listing of {rel!r} is over {self._listing_bytes} bytes: list a narrower "
                    "folder or fewer levels (depth)",
                    reason=Reason.LISTING_TOO_LARGE,
                    metadata={"path": rel, "limit": str(self._listing_bytes)},
                ) from None
            return parse_records(result.stdout)

    async def walk(self, session: Session, path: str) -> AsyncGenerator[FileInfo, None]:
        """Every entry beneath `path` (MAX_LIST_DEPTH levels), streamed: for internal scans
        of a whole tree, which no reply limit bounds."""
        rel = validation.workspace_relpath(path or ".")
        lines = self.helper.lines(session, ["list", rel, str(MAX_LIST_DEPTH)], rel)
        async with contextlib.aclosing(lines):  # the exec ends with the walk, however it ends
            async for line in lines:
                if line.strip():
                    yield parse_records(line)[0]

    async def remove(self, session: Session, path: str, recursive: bool) -> None:
        rel = validation.workspace_relpath(path, allow_root=False)
        await self._checked(
            session, ["remove", rel] + (["--recursive"] if recursive else []), rel, max_stdout=4096
        )
        self._observer.emit(
            domain_events.FileRemoved(session.tenant, session.session_id, path, recursive)
        )

    async def make_dir(self, session: Session, path: str, parents: bool) -> FileInfo:
        rel = validation.workspace_relpath(path, allow_root=False)
        result = await self._checked(
            session, ["mkdir", rel] + (["--parents"] if parents else []), rel, max_stdout=64 * 1024
        )
        self._observer.emit(domain_events.DirectoryMade(session.tenant, session.session_id, path))
        return parse_records(result.stdout)[0]
