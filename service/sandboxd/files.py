"""File operations confined to /workspace.

The server validates paths lexically; the `sbx` helper then resolves them inside the
container with openat2(RESOLVE_BENEATH), so a symlink planted by a command can never lead a
read, write or listing out of the workspace, whatever races the command runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from sandboxd import validation
from sandboxd.engine import Engine, ExecStream
from sandboxd.errors import (
    AlreadyExists,
    EngineUnavailable,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    SandboxError,
)
from sandboxd.models import FileContent, FileInfo, FileType, Session
from sandboxd.profile import HELPER_IN_CONTAINER

MAX_LIST_DEPTH = 32
_STDERR_LIMIT = 64 * 1024
_LISTING_LIMIT = 64 * 1024 * 1024

_TYPES = {
    "file": FileType.FILE,
    "dir": FileType.DIRECTORY,
    "symlink": FileType.SYMLINK,
    "other": FileType.OTHER,
}


@dataclass(frozen=True)
class _Result:
    exit_code: int
    stdout: bytes
    stderr: bytes


def _helper_error(result: _Result, path: str) -> SandboxError:
    """Turn the helper's JSON error line into the domain error a caller should see."""
    try:
        doc = json.loads(result.stderr.decode(errors="replace").strip().splitlines()[-1])
        name, message = str(doc["error"]), str(doc.get("message", ""))
    except (ValueError, IndexError, KeyError, TypeError):
        text = result.stderr.decode(errors="replace").strip()[:500]
        return Internal(f"file helper failed (exit {result.exit_code}): {text}")
    meta = {"path": path}
    shown = path if path != "." else "/workspace"
    match name:
        case "ENOENT":
            return NotFound(
                f"{shown}: no such file or directory", reason="FILE_NOT_FOUND", metadata=meta
            )
        case "ENOTDIR":
            return FailedPrecondition(
                f"{shown}: not a directory", reason="NOT_A_DIRECTORY", metadata=meta
            )
        case "EISDIR":
            return FailedPrecondition(
                f"{shown}: is a directory", reason="IS_A_DIRECTORY", metadata=meta
            )
        case "EEXIST":
            return AlreadyExists(f"{shown}: already exists", reason="FILE_EXISTS", metadata=meta)
        case "ENOTEMPTY":
            return FailedPrecondition(
                f"{shown}: directory not empty (set recursive)",
                reason="DIRECTORY_NOT_EMPTY",
                metadata=meta,
            )
        case "ENOSPC":
            return ResourceExhausted(
                f"{shown}: the workspace is full", reason="WORKSPACE_FULL", metadata=meta
            )
        case "EACCES":
            return PermissionDenied(
                f"{shown}: permission denied", reason="FILE_PERMISSION_DENIED", metadata=meta
            )
        case "ESCAPE":
            return InvalidArgument(
                f"{shown}: resolves outside /workspace (symlinks are not followed out)",
                reason="PATH_OUTSIDE_WORKSPACE",
                metadata=meta,
            )
        case "TOO_LARGE":
            return ResourceExhausted(f"{shown}: {message}", reason="FILE_TOO_LARGE", metadata=meta)
        case "EINVAL":
            return InvalidArgument(f"{shown}: {message}", reason="PATH_INVALID", metadata=meta)
        case _:
            return Internal(f"{shown}: {message or name}")


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


def _parse_records(stdout: bytes) -> list[FileInfo]:
    try:
        return [_file_info(json.loads(line)) for line in stdout.splitlines() if line.strip()]
    except (ValueError, KeyError, TypeError) as exc:
        raise Internal(f"file helper printed an unexpected record: {exc}") from exc


async def _feed(stream: ExecStream, data: bytes) -> None:
    """Write stdin, then half-close; a broken pipe is not the answer (the exit status is)."""
    with contextlib.suppress(EngineUnavailable):
        if data:
            await stream.write(data)
        stream.close_stdin()


class Files:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def _helper(
        self, session: Session, args: list[str], *, stdin: bytes | None = None, max_stdout: int
    ) -> _Result:
        stdout, stderr = bytearray(), bytearray()
        async with self._engine.exec(
            session.container_id,
            [HELPER_IN_CONTAINER, *args],
            user=session.spec.user,
            stdin=stdin is not None,
        ) as stream:
            # Feed stdin beside reading: the helper may refuse before it reads all of stdin
            # (a full workspace, a bad path), and then a write would wait forever for room.
            feeder = asyncio.create_task(_feed(stream, stdin)) if stdin is not None else None
            try:
                while (chunk := await stream.read()) is not None:
                    fd, data = chunk
                    if fd == 1:
                        if len(stdout) + len(data) > max_stdout:
                            raise Internal("file helper printed more than expected")
                        stdout += data
                    elif len(stderr) < _STDERR_LIMIT:
                        stderr += data[: _STDERR_LIMIT - len(stderr)]
            finally:
                if feeder is not None:
                    feeder.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await feeder
            code = await stream.wait_exit_code()
        return _Result(code, bytes(stdout), bytes(stderr))

    async def _checked(self, session: Session, args: list[str], path: str, **kw: Any) -> _Result:
        result = await self._helper(session, args, **kw)
        if result.exit_code != 0:
            raise _helper_error(result, path)
        return result

    async def helper_checked(self, session: Session, args: list[str], path: str) -> bytes:
        """Run one helper subcommand with small output; its error mapped as for file calls."""
        return (await self._checked(session, args, path, max_stdout=64 * 1024)).stdout

    async def read(self, session: Session, path: str) -> FileContent:
        rel = validation.workspace_relpath(path, allow_root=False)
        cap = session.spec.limits.file_bytes
        result = await self._checked(session, ["read", rel, str(cap)], rel, max_stdout=cap + 4096)
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
        mode = validation.validate_file_mode(mode, default=0o644)
        cap = session.spec.limits.file_bytes
        if len(content) > cap:
            raise ResourceExhausted(
                f"{rel}: {len(content)} bytes is over the file cap of {cap}",
                reason="FILE_TOO_LARGE",
                metadata={"path": rel, "limit": str(cap)},
            )
        args = ["write", rel, format(mode, "o"), str(cap)] + (["--parents"] if make_parents else [])
        result = await self._checked(session, args, rel, stdin=content, max_stdout=64 * 1024)
        return _parse_records(result.stdout)[0]

    async def stat(self, session: Session, path: str) -> FileInfo:
        rel = validation.workspace_relpath(path or ".")
        result = await self._checked(session, ["stat", rel], rel, max_stdout=64 * 1024)
        return _parse_records(result.stdout)[0]

    async def list_dir(self, session: Session, path: str, depth: int) -> list[FileInfo]:
        rel = validation.workspace_relpath(path or ".")
        if depth < 0 or depth > MAX_LIST_DEPTH:
            raise InvalidArgument(
                f"depth must be between 0 and {MAX_LIST_DEPTH}", reason="INVALID_DEPTH"
            )
        result = await self._checked(
            session, ["list", rel, str(max(depth, 1))], rel, max_stdout=_LISTING_LIMIT
        )
        return _parse_records(result.stdout)

    async def remove(self, session: Session, path: str, recursive: bool) -> None:
        rel = validation.workspace_relpath(path, allow_root=False)
        await self._checked(
            session, ["remove", rel] + (["--recursive"] if recursive else []), rel, max_stdout=4096
        )

    async def make_dir(self, session: Session, path: str, parents: bool) -> FileInfo:
        rel = validation.workspace_relpath(path, allow_root=False)
        result = await self._checked(
            session, ["mkdir", rel] + (["--parents"] if parents else []), rel, max_stdout=64 * 1024
        )
        return _parse_records(result.stdout)[0]
