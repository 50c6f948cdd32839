"""The one client of the in-sandbox helper `sbx` (helper/).

Every internal run of the helper goes through here: file operations (`sbx read`, `list`...),
the tools the server runs under `sbx run` (tar for archives), and the control commands
(`sbx kill`, `sbx signal`). One exec-and-drain loop (stdin fed beside the reading, so a helper
that refuses early never leaves a write waiting; stdout bounded; stderr kept to its start),
one parser of the helper's structured error line, one mapping from it to domain errors.

Internal runs never see the session's environment (sandboxd.commands.argv says how). The
runs themselves go through the one owner of sandbox commands (sandboxd.commands: the agent's
channel first, the engine's exec as the fallback), as typed commands: a helper subcommand
(`HelperCall`) or a tool (`ToolRun`, from `tool_argv`).

Commands a caller asked for (Exec, Run, processes) are not internal runs: execution.py
starts those (`Supervised`) with the caller's environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass

from sandboxd.commands.argv import INTERNAL_ENV, LOADER_VARIABLES
from sandboxd.commands.types import HelperCall, Packed, SandboxCommands, ToolRun, Unpacked, Where
from sandboxd.engine import ExecStream
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
from sandboxd.models import Session
from sandboxd.reasons import Reason

STDERR_LIMIT = 64 * 1024  # the helper's error line is short; a tool's complaint is cut here
SMALL_STDOUT = 64 * 1024  # what a helper subcommand prints besides a listing or a file

HelperTarget = Session | Where


@dataclass(frozen=True)
class HelperResult:
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def error(self) -> HelperError | None:
        return parse_error(self.stderr)

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode(errors="replace").strip()


@dataclass(frozen=True)
class HelperError:
    """The helper's structured error: `{"error": NAME, "message": TEXT}` as its last line."""

    name: str
    message: str


def parse_error(stderr: bytes) -> HelperError | None:
    """The helper's error line, None when stderr does not end with one (a tool's own text)."""
    lines = stderr.decode(errors="replace").strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        return None
    try:
        doc = json.loads(lines[-1])
        return HelperError(str(doc["error"]), str(doc.get("message", "")))
    except (ValueError, KeyError, TypeError):
        return None


class StdoutOverflow(Internal):
    """The helper printed more than the caller allowed (stopped there, the run abandoned)."""


class NoRoom(ResourceExhausted):
    """A tool ran out of space in the workspace (as opposed to input being over a cap)."""


def tool_argv(cwd: str, argv: Sequence[str], through: Packed | Unpacked | None = None) -> ToolRun:
    """An internal tool run in `cwd` (checked beneath /workspace) with the environment
    cleared; `through` the helper's compression of its output or input."""
    return ToolRun(cwd, tuple(argv), through)


# How each errno-like name the file subcommands report reaches the caller: the error class,
# the reason, and the message after the path ("{message}" is the helper's own text).
_FILE_ERRORS: dict[str, tuple[type[SandboxError], Reason, str]] = {
    "ENOENT": (NotFound, Reason.FILE_NOT_FOUND, "no such file or directory"),
    "ENOTDIR": (FailedPrecondition, Reason.NOT_A_DIRECTORY, "not a directory"),
    "EISDIR": (FailedPrecondition, Reason.IS_A_DIRECTORY, "is a directory"),
    "EEXIST": (AlreadyExists, Reason.FILE_EXISTS, "already exists"),
    "ENOTEMPTY": (
        FailedPrecondition,
        Reason.DIRECTORY_NOT_EMPTY,
        "directory not empty (set recursive)",
    ),
    "ENOSPC": (NoRoom, Reason.WORKSPACE_FULL, "the workspace is full"),
    "EACCES": (PermissionDenied, Reason.FILE_PERMISSION_DENIED, "permission denied"),
    "ESCAPE": (
        InvalidArgument,
        Reason.PATH_OUTSIDE_WORKSPACE,
        "resolves outside /workspace (symlinks are not followed out)",
    ),
    "TOO_LARGE": (ResourceExhausted, Reason.FILE_TOO_LARGE, "{message}"),
    # A count the kernel keeps for the session's host uid (inotify instances or watches):
    # the session's own, since each session has a uid of its own (host_ids.py).
    "KERNEL_LIMIT": (ResourceExhausted, Reason.KERNEL_LIMIT_REACHED, "{message}"),
    "EINVAL": (InvalidArgument, Reason.PATH_INVALID, "{message}"),
}


def file_error(result: HelperResult, path: str) -> SandboxError:
    """A file subcommand's failure as the domain error a caller should see."""
    err = result.error
    if err is None:
        return Internal(f"file helper failed (exit {result.exit_code}): {result.stderr_text[:500]}")
    shown = path if path != "." else "/workspace"
    known = _FILE_ERRORS.get(err.name)
    if known is None:
        return Internal(f"{shown}: {err.message or err.name}")
    cls, reason, text = known
    text = text.replace("{message}", err.message)
    return cls(f"{shown}: {text}", reason=reason, metadata={"path": path})


def tool_error(what: str, tool: str, result: HelperResult, path: str) -> SandboxError:
    """A tool's failure under `sbx run`: sbx speaks (exit 126/127) only when it could not
    start the tool, most often because the folder `path` is not one in the workspace."""
    text = result.stderr_text
    low = text.lower()
    meta = {"path": path}
    if "no space" in low or "quota" in low:
        return NoRoom(f"{what}: the workspace is full", reason=Reason.WORKSPACE_FULL, metadata=meta)
    err = result.error if result.exit_code in (126, 127) else None
    if err is not None and err.name == "ESCAPE":
        return InvalidArgument(
            f"{path}: resolves outside /workspace",
            reason=Reason.PATH_OUTSIDE_WORKSPACE,
            metadata=meta,
        )
    if err is not None and err.name == "ENOENT":
        # A missing path is FILE_NOT_FOUND in every RPC, as in file_error.
        return NotFound(
            f"{what}: {path}: no such file or directory (or {tool} is missing from the image)",
            reason=Reason.FILE_NOT_FOUND,
            metadata=meta,
        )
    if err is not None and err.name == "ENOTDIR":
        return FailedPrecondition(
            f"{what}: {path} is not a folder in the workspace (or {tool} is missing from the "
            "image)",
            reason=Reason.NOT_A_DIRECTORY,
            metadata=meta,
        )
    return Internal(f"{what}: {tool} exited {result.exit_code}: {text[:500]}")


async def _feed(stream: ExecStream, data: bytes) -> None:
    """Write stdin, then half-close; a broken pipe is not the answer (the exit status is)."""
    with contextlib.suppress(EngineUnavailable, ConnectionError):
        if data:
            await stream.write(data)
        stream.close_stdin()


def _where(target: HelperTarget) -> Where:
    return target if isinstance(target, Where) else Where(target.container_id, target.spec.user)


HelperArgs = Sequence[str] | ToolRun  # a helper subcommand's arguments, or a tool


class HelperClient:
    """Runs `sbx` subcommands in a session's container, as the session's user."""

    def __init__(self, commands: SandboxCommands) -> None:
        self.commands = commands

    @contextlib.asynccontextmanager
    async def open(
        self, target: HelperTarget, args: HelperArgs, *, stdin: bool = False
    ) -> AsyncIterator[ExecStream]:
        """A started `sbx ARGS` (a `tool_argv` for a tool), for callers that stream."""
        command = args if isinstance(args, ToolRun) else HelperCall(tuple(args))
        async with self.commands.open(_where(target), command, stdin=stdin) as stream:
            yield stream

    async def run(
        self,
        target: HelperTarget,
        args: HelperArgs,
        *,
        stdin: bytes | None = None,
        max_stdout: int = SMALL_STDOUT,
        timeout_s: float | None = None,
    ) -> HelperResult:
        """Run to the end: its exit code, stdout (at most `max_stdout`) and stderr's start."""
        async with asyncio.timeout(timeout_s):
            async with self.open(target, args, stdin=stdin is not None) as stream:
                out, err = await drain(stream, stdin=stdin, max_stdout=max_stdout)
                code = await stream.wait_exit_code()
        return HelperResult(code, out, err)

    async def lines(
        self, target: HelperTarget, args: HelperArgs, path: str, *, max_line: int = SMALL_STDOUT
    ) -> AsyncGenerator[bytes, None]:
        """The lines `sbx ARGS` prints, as they come (a listing never held whole); its failure
        raised as a file operation's error once the lines are through. Iterate to the end."""
        stderr, pending = bytearray(), bytearray()
        async with self.open(target, args) as stream:
            while (chunk := await stream.read()) is not None:
                fd, data = chunk
                if fd != 1:
                    stderr += data[: STDERR_LIMIT - len(stderr)]
                    continue
                pending += data
                if b"\n" in data:
                    *done, rest = pending.split(b"\n")
                    pending = bytearray(rest)
                    for line in done:
                        yield bytes(line)
                if len(pending) > max_line:
                    raise StdoutOverflow("the helper printed a line longer than expected")
            code = await stream.wait_exit_code()
        if pending:
            yield bytes(pending)
        if code != 0:
            raise file_error(HelperResult(code, b"", bytes(stderr)), path)

    async def checked(
        self,
        target: HelperTarget,
        args: HelperArgs,
        path: str,
        *,
        stdin: bytes | None = None,
        max_stdout: int = SMALL_STDOUT,
    ) -> HelperResult:
        """`run`, with a failure raised as the file operation's domain error."""
        result = await self.run(target, args, stdin=stdin, max_stdout=max_stdout)
        if result.exit_code != 0:
            raise file_error(result, path)
        return result


async def drain(
    stream: ExecStream,
    *,
    stdin: bytes | None = None,
    max_stdout: int = SMALL_STDOUT,
    stderr_limit: int = STDERR_LIMIT,
) -> tuple[bytes, bytes]:
    """Feed `stdin` (then half-close) beside reading; stdout and stderr's first bytes.

    Reading is the backpressure: the engine's socket is read only as fast as this loop goes.
    More stdout than `max_stdout` is the helper misbehaving: Internal.
    """
    stdout, stderr = bytearray(), bytearray()
    feeder = asyncio.create_task(_feed(stream, stdin)) if stdin is not None else None
    try:
        while (chunk := await stream.read()) is not None:
            fd, data = chunk
            if fd == 1:
                if len(stdout) + len(data) > max_stdout:
                    raise StdoutOverflow("the helper printed more than expected")
                stdout += data
            elif len(stderr) < stderr_limit:
                stderr += data[: stderr_limit - len(stderr)]
    finally:
        if feeder is not None:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
    return bytes(stdout), bytes(stderr)


__all__ = [
    "INTERNAL_ENV",
    "LOADER_VARIABLES",
    "HelperClient",
    "HelperError",
    "HelperResult",
    "HelperTarget",
    "NoRoom",
    "StdoutOverflow",
    "Where",
    "drain",
    "file_error",
    "parse_error",
    "tool_argv",
    "tool_error",
]
