"""Unit tests of the one client of the in-sandbox helper (sandboxd.helper_client): the exec it
asks the engine for (the session's environment overridden, tools started through `env -i`),
the drain loop, the parser of the helper's error line and the mapping to domain errors.

The engine here is a scripted stand-in that records the exec request and replays output; the
real engine runs the same paths in tests/integration (test_files, test_archive, and
test_hostile_streams' environment case)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sandboxd.commands.argv import argv_of
from sandboxd.commands.sandbox import AgentFirstCommands
from sandboxd.engine.protocol import ExecRequest
from sandboxd.errors import (
    AlreadyExists,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from sandboxd.helper_client import (
    INTERNAL_ENV,
    HelperClient,
    HelperResult,
    NoRoom,
    StdoutOverflow,
    Where,
    file_error,
    parse_error,
    tool_argv,
    tool_error,
)
from sandboxd.profile import HELPER_IN_CONTAINER


class _Stream:
    def __init__(self, frames: list[tuple[int, bytes]], code: int) -> None:
        self._frames = list(frames)
        self._code = code
        self.stdin = bytearray()
        self.stdin_closed = False

    async def read(self) -> tuple[int, bytes] | None:
        await asyncio.sleep(0)
        return self._frames.pop(0) if self._frames else None

    async def write(self, data: bytes) -> None:
        self.stdin += data

    def close_stdin(self) -> None:
        self.stdin_closed = True

    async def wait_exit_code(self) -> int:
        return self._code


class _Engine:
    def __init__(self, frames: list[tuple[int, bytes]], code: int = 0) -> None:
        self.frames, self.code = frames, code
        self.calls: list[dict[str, Any]] = []
        self.stream: _Stream | None = None

    @contextlib.asynccontextmanager
    async def exec(self, container_id: str, request: ExecRequest) -> AsyncIterator[_Stream]:
        self.calls.append({"container_id": container_id, **vars(request)})
        self.stream = _Stream(self.frames, self.code)
        yield self.stream


WHERE = Where("c1", "1000:1000")


def _client(engine: _Engine) -> HelperClient:
    return HelperClient(AgentFirstCommands(engine, engine, None))  # type: ignore[arg-type]


async def test_every_internal_exec_overrides_path_and_loader_variables() -> None:
    engine = _Engine([(1, b"ok")])
    await _client(engine).run(WHERE, ["stat", "x"])
    call = engine.calls[0]
    assert call["argv"] == [HELPER_IN_CONTAINER, "stat", "x"]
    assert call["user"] == "1000:1000"
    env = call["env"]
    assert env is INTERNAL_ENV
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    for name in ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT"):
        assert env[name] == ""


def test_a_tool_starts_with_a_cleared_environment() -> None:
    argv = argv_of(tool_argv("dir", ["tar", "-c"]))
    assert argv == [HELPER_IN_CONTAINER, "run", "--clean-env", "--cwd", "dir", "--", "tar", "-c"]


async def test_run_feeds_stdin_then_half_closes_and_collects_both_streams() -> None:
    engine = _Engine([(1, b"out1"), (2, b"err"), (1, b"out2")], code=3)
    result = await _client(engine).run(WHERE, ["write"], stdin=b"payload")
    assert result == HelperResult(3, b"out1out2", b"err")
    assert engine.stream is not None
    assert bytes(engine.stream.stdin) == b"payload" and engine.stream.stdin_closed


async def test_more_stdout_than_allowed_stops_the_run() -> None:
    engine = _Engine([(1, b"x" * 600), (1, b"y" * 600)])
    with pytest.raises(StdoutOverflow):
        await _client(engine).run(WHERE, ["list"], max_stdout=1000)


async def test_stderr_is_kept_to_its_start() -> None:
    engine = _Engine([(2, b"e" * 50_000), (2, b"f" * 50_000)], code=1)
    result = await _client(engine).run(WHERE, ["x"])
    assert len(result.stderr) == 64 * 1024


async def test_lines_stream_and_the_failure_comes_after_them() -> None:
    engine = _Engine([(1, b"a\nb"), (1, b"c\n"), (1, b"d"), (2, b'{"error":"ENOENT"}\n')], 1)
    got: list[bytes] = []
    with pytest.raises(NotFound):
        async for line in _client(engine).lines(WHERE, ["list"], "p"):
            got.append(line)
    assert got == [b"a", b"bc", b"d"]


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        (b'{"error":"ENOENT","message":"no"}\n', ("ENOENT", "no")),
        (b'warning\n{"error":"ESCAPE"}', ("ESCAPE", "")),
        (b"tar: something\n", None),
        (b"", None),
        (b"{not json\n", None),
        (b'{"message":"no name"}', None),
    ],
)
def test_parse_error(stderr: bytes, expected: tuple[str, str] | None) -> None:
    got = parse_error(stderr)
    assert (None if got is None else (got.name, got.message)) == expected


@pytest.mark.parametrize(
    ("name", "cls", "reason"),
    [
        ("ENOENT", NotFound, "FILE_NOT_FOUND"),
        ("ENOTDIR", FailedPrecondition, "NOT_A_DIRECTORY"),
        ("EISDIR", FailedPrecondition, "IS_A_DIRECTORY"),
        ("EEXIST", AlreadyExists, "FILE_EXISTS"),
        ("ENOTEMPTY", FailedPrecondition, "DIRECTORY_NOT_EMPTY"),
        ("ENOSPC", NoRoom, "WORKSPACE_FULL"),
        ("ESCAPE", InvalidArgument, "PATH_OUTSIDE_WORKSPACE"),
        ("TOO_LARGE", ResourceExhausted, "FILE_TOO_LARGE"),
        # inotify instances or watches of the session's uid: a kernel limit, not a full disk
        ("KERNEL_LIMIT", ResourceExhausted, "KERNEL_LIMIT_REACHED"),
        ("EINVAL", InvalidArgument, "PATH_INVALID"),
    ],
)
def test_file_errors_map_to_domain_errors(name: str, cls: type, reason: str) -> None:
    err = file_error(HelperResult(1, b"", f'{{"error":"{name}"}}'.encode()), "a/b")
    assert type(err) is cls
    assert err.reason == reason
    assert err.metadata == {"path": "a/b"}


def test_a_helper_without_an_error_line_is_internal() -> None:
    assert isinstance(file_error(HelperResult(139, b"", b"Segmentation fault"), "p"), Internal)


def test_tool_errors() -> None:
    def err(code: int, stderr: bytes) -> Exception:
        return tool_error("export", "tar", HelperResult(code, b"", stderr), "dir")

    assert isinstance(err(1, b"tar: write error: No space left on device"), NoRoom)
    escape = err(127, b'{"error":"ESCAPE"}')
    assert isinstance(escape, InvalidArgument) and escape.reason == "PATH_OUTSIDE_WORKSPACE"
    missing = err(127, b'{"error":"ENOENT"}')
    assert isinstance(missing, NotFound) and missing.reason == "FILE_NOT_FOUND"
    not_dir = err(127, b'{"error":"ENOTDIR"}')
    assert isinstance(not_dir, FailedPrecondition) and not_dir.reason == "NOT_A_DIRECTORY"
    # The tool's own JSON-looking output with an ordinary exit is the tool's, not sbx's.
    assert isinstance(err(2, b'{"error":"ESCAPE"}'), Internal)
