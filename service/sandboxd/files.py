"""File operations confined to /workspace.

The server validates paths lexically; the `sbx` helper then resolves them inside the
container with openat2(RESOLVE_BENEATH), so a symlink planted by a command can never lead a
read, write or listing out of the workspace, whatever races the command runs.
"""

from __future__ import annotations

import json
from typing import Any

from sandboxd import validation
from sandboxd.engine import Engine
from sandboxd.errors import Internal, InvalidArgument, ResourceExhausted
from sandboxd.helper_client import HelperClient, HelperResult
from sandboxd.models import FileContent, FileInfo, FileType, Session

MAX_LIST_DEPTH = 32
_LISTING_LIMIT = 64 * 1024 * 1024

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


def _parse_records(stdout: bytes) -> list[FileInfo]:
    try:
        return [_file_info(json.loads(line)) for line in stdout.splitlines() if line.strip()]
    except (ValueError, KeyError, TypeError) as exc:
        raise Internal(f"file helper printed an unexpected record: {exc}") from exc


class Files:
    def __init__(self, engine: Engine, helper: HelperClient | None = None) -> None:
        self.helper = helper or HelperClient(engine)

    async def _checked(
        self, session: Session, args: list[str], path: str, **kw: Any
    ) -> HelperResult:
        return await self.helper.checked(session, args, path, **kw)

    async def helper_checked(self, session: Session, args: list[str], path: str) -> bytes:
        """Run one helper subcommand with small output; its error mapped as for file calls."""
        return (await self._checked(session, args, path)).stdout

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
