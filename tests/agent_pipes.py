"""The real agent (`sbx agent`, built from helper/*.c) as a child process of a unit test, over
pipes: the one way every Docker-free test runs it (outside a PID namespace the agent is a child
subreaper, which is all they need).

- Builds: the static helper and its ASan/UBSan build (`make helper`, `make helper-asan`), each
  made once per session (fixture `helper_builds`, a pytest plugin of tests/conftest.py);
  `agent_helper` runs a test against both, the sanitizer one with `ASAN_ENV`.
- Starting it: `AgentProcess` (synchronous, frame by frame through tests/agent_wire.py's
  codec) and `agent_process` (asyncio, for the server's `Channel` over a `PipeTransport`). Both
  keep the agent's stderr in a file and fail the test on any sanitizer report in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from agent_wire import (
    CLOSE,
    DATA,
    EXIT,
    HELLO,
    HELLO_OK,
    OPEN,
    RESET,
    SYNC,
    Decoder,
    Frame,
    encode_json,
    window,
)

REPO = Path(__file__).resolve().parents[1]
HELPER_SOURCES = sorted(str(p) for p in (REPO / "helper").glob("*.c"))
STATIC_FLAGS = ["-static", "-O2", "-Wall", "-Wextra", "-Werror"]
LIBS = ["-lzstd"]  # after the sources, as the Makefile links them
# As `make helper-asan` builds build/sbx-asan.
ASAN_FLAGS = [
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=undefined",
]
SANITIZER_MARKS = ("AddressSanitizer", "runtime error:", "LeakSanitizer", "UndefinedBehavior")
ASAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=0:exitcode=99",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}
BUILDS = ("static", "asan")
BASE_ENV = {"PATH": "/usr/bin:/bin"}


@dataclass(frozen=True)
class Helper:
    """One build of the helper."""

    path: Path
    asan: bool

    def argv(self, root: Path, args: tuple[str, ...] = ()) -> list[str]:
        return [str(self.path), "--root", str(root), "agent", *args]

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` exactly, plus what the sanitizer build needs to report and stop."""
        return {**base, **(ASAN_ENV if self.asan else {})}


def build_helper(out: Path, asan: bool) -> str | None:
    """The helper from helper/*.c at `out`: a copy of what `make helper` / `make helper-asan`
    built when it is newer than every source (a copy: a `make` while the tests run cannot
    change the binary under them), else compiled; the compiler's complaint when it cannot be."""
    built = REPO / "build" / ("sbx-asan" if asan else "sbx")
    sources = [Path(p) for p in HELPER_SOURCES] + list((REPO / "helper").glob("*.h"))
    if built.exists() and built.stat().st_mtime > max(p.stat().st_mtime for p in sources):
        shutil.copy2(built, out)
        return None
    flags = ASAN_FLAGS if asan else STATIC_FLAGS
    cp = subprocess.run(
        ["gcc", *flags, "-o", str(out), *HELPER_SOURCES, *LIBS],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if cp.returncode == 0 else cp.stderr.strip()[:500]


class Builds:
    """Each build made at most once per session, when a test first asks for it. The static
    one must build; where the compiler cannot make the sanitizer one, its tests skip saying
    why."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._made: dict[str, Helper | str] = {}

    def get(self, kind: str) -> Helper:
        assert kind in BUILDS, kind
        if kind not in self._made:
            out = self._dir / ("sbx-asan" if kind == "asan" else "sbx")
            problem = build_helper(out, kind == "asan")
            self._made[kind] = Helper(out, kind == "asan") if problem is None else problem
        made = self._made[kind]
        if isinstance(made, str):
            if kind == "static":
                pytest.fail(f"the helper does not build: {made}")
            pytest.skip(f"the compiler cannot build the sanitizer helper: {made}")
        return made


@pytest.fixture(scope="session")
def helper_builds(tmp_path_factory: pytest.TempPathFactory) -> Builds:
    return Builds(tmp_path_factory.mktemp("helper"))


@pytest.fixture(scope="session")
def sbx() -> Iterator[str]:
    """The static helper's path for the tests that run its commands (`sbx run`, `list`, `dial`,
    `watch`, ...): one per session, `make helper`'s build when it is fresh, else the same gcc
    command. Its directory is one every user may traverse: the unprivileged-user tests exec
    it."""
    directory = tempfile.mkdtemp(prefix="sbx-build-")
    try:
        os.chmod(directory, 0o755)
        out = Path(directory) / "sbx"
        problem = build_helper(out, asan=False)
        if problem is not None:
            pytest.fail(f"the helper does not build: {problem}")
        yield str(out)
    finally:
        shutil.rmtree(directory)


@pytest.fixture(params=BUILDS)
def agent_helper(request: pytest.FixtureRequest, helper_builds: Builds) -> Helper:
    """Every test that asks runs against the static helper and against its ASan/UBSan build."""
    return helper_builds.get(str(request.param))


def check_stderr(log: IO[bytes]) -> str:
    """What the agent wrote to its stderr (`log`); a sanitizer report in it fails the test."""
    log.seek(0)
    text = log.read().decode(errors="replace")
    assert not any(mark in text for mark in SANITIZER_MARKS), text[-4000:]
    return text


# ---------------------------------------------------------------- asyncio: the server's Channel


class PipeTransport:
    """The channel's Transport over the agent's stdin and stdout. `close_stdin`: closing the
    channel closes the agent's stdin too (the agent then ends); without, the pipe stays open
    for another epoch (a restarted server's channel on the same agent)."""

    def __init__(self, proc: asyncio.subprocess.Process, *, close_stdin: bool = False) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self._in = proc.stdin
        self._out = proc.stdout
        self._close_stdin = close_stdin

    async def read(self) -> bytes | None:
        chunk = await self._out.read(1 << 16)
        return chunk or None

    async def write(self, data: bytes) -> None:
        self._in.write(data)
        await self._in.drain()

    async def close(self) -> None:
        if self._close_stdin:
            with contextlib.suppress(Exception):
                self._in.close()


@contextlib.asynccontextmanager
async def agent_process(
    helper: Helper,
    root: Path,
    env: Mapping[str, str] = BASE_ENV,
    args: tuple[str, ...] = (),
    prefix: tuple[str, ...] = (),
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`sbx --root root agent *args` with exactly `env` (plus ASAN_ENV for the sanitizer
    build), run through `prefix` when given (`unshare --pid --fork`: the agent as PID 1);
    killed and reaped on exit, then its stderr checked."""
    with tempfile.TemporaryFile() as log:
        proc = await asyncio.create_subprocess_exec(
            *prefix,
            *helper.argv(root, args),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env=helper.env(env),
        )
        try:
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            check_stderr(log)


# The environment the channel tests give the agent and their commands.
CHANNEL_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@pytest.fixture
async def piped_agent(
    agent_helper: Helper, tmp_path: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """The agent (static, then ASan) on pipes, with a workspace root of the test's own, for
    the server's channel to talk to."""
    root = tmp_path / "ws"
    root.mkdir()
    async with agent_process(agent_helper, root, CHANNEL_ENV) as proc:
        yield proc


# ---------------------------------------------------------------- synchronous: frame by frame


class AgentProcess:
    """`sbx agent` on pipes, with a workspace root of the test's own, read frame by frame with
    a timeout."""

    def __init__(
        self,
        helper: Helper,
        root: Path,
        env: Mapping[str, str] = BASE_ENV,
        args: tuple[str, ...] = (),
    ) -> None:
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            helper.argv(root, args),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=helper.env(env),
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin = self.proc.stdin
        self.out_fd = self.proc.stdout.fileno()
        os.set_blocking(self.out_fd, False)
        self.decoder = Decoder()
        self.pending: list[Frame] = []
        self.nonce = 0
        self.next_id = 1
        self.stderr_text = ""

    def send(self, raw: bytes) -> None:
        self.stdin.write(raw)
        self.stdin.flush()

    def hello(self, retry: float = 0.5, timeout: float = 10, **fields: object) -> Frame:
        """SYNC + HELLO, resent every `retry` seconds as the server does, until the HELLO_OK
        with this nonce (what precedes it is dropped)."""
        self.nonce += 1
        nonce = f"{self.nonce:016x}"
        body = {"version": 1, "nonce": nonce, "window": 262144, "keepalive_ms": 60000}
        body.update(fields)
        self.next_id = 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.send(SYNC + encode_json(HELLO, 0, body))
            resend = time.monotonic() + retry
            while time.monotonic() < resend:
                try:
                    f = self.read(timeout=max(0.01, resend - time.monotonic()))
                except TimeoutError:
                    break
                if f.type == HELLO_OK and _nonce_of(f) == nonce:
                    self.pending.clear()
                    return f
        raise TimeoutError("no HELLO_OK from the agent")

    def open_id(self) -> int:
        sid = self.next_id
        self.next_id += 2
        return sid

    def open(self, kind: str, **fields: object) -> int:
        sid = self.open_id()
        self.send(encode_json(OPEN, sid, {"kind": kind, **fields}))
        return sid

    def _fill(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.out_fd], [], [], timeout)
        if not ready:
            return False
        chunk = os.read(self.out_fd, 1 << 20)
        if not chunk:
            raise EOFError("the agent closed its output")
        self.pending += self.decoder.feed(chunk)
        return True

    def read(self, timeout: float = 10) -> Frame:
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not self._fill(left):
                raise TimeoutError("no frame from the agent")
        return self.pending.pop(0)

    def read_until(self, pred: Any, timeout: float = 10) -> list[Frame]:
        """Frames up to and including the first that satisfies pred."""
        got: list[Frame] = []
        deadline = time.monotonic() + timeout
        while True:
            f = self.read(max(0.01, deadline - time.monotonic()))
            got.append(f)
            if pred(f):
                return got

    def quiet(self, seconds: float) -> list[Frame]:
        """Everything the agent sends within `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._fill(max(0.0, deadline - time.monotonic()))
        got, self.pending = self.pending, []
        return got

    def stream_frames(self, sid: int, timeout: float = 10) -> list[Frame]:
        """Every frame of stream `sid` until it ends (EXIT, RESET or CLOSE), refilling its
        window as it goes; frames of other streams stay pending."""
        got: list[Frame] = []
        others: list[Frame] = []
        deadline = time.monotonic() + timeout
        try:
            while True:
                f = self.read(max(0.01, deadline - time.monotonic()))
                if f.stream != sid:
                    others.append(f)
                    continue
                got.append(f)
                if f.type == DATA:
                    self.send(window(sid, len(f.payload) - 1))
                if f.type in (EXIT, RESET, CLOSE):
                    return got
        finally:
            self.pending[:0] = others

    def close(self) -> int:
        """Closes the agent's input (outside a PID namespace it then ends what it runs and
        exits); its stderr is kept in `stderr_text`, and a sanitizer report in it fails the
        test. Idempotent."""
        if self._log.closed:
            return self.proc.wait()
        try:
            self.stdin.close()
        except BrokenPipeError:
            pass
        try:
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.returncode is None:
                self.proc.kill()
                self.proc.wait()
            assert self.proc.stdout is not None
            self.proc.stdout.close()
            with self._log:
                self.stderr_text = check_stderr(self._log)


@contextlib.contextmanager
def running_agent(
    helper: Helper, root: Path, env: Mapping[str, str] = BASE_ENV, args: tuple[str, ...] = ()
) -> Iterator[AgentProcess]:
    """An `AgentProcess` closed (and its stderr checked) when the block ends."""
    a = AgentProcess(helper, root, env, args)
    try:
        yield a
    finally:
        a.close()


def _nonce_of(f: Frame) -> object:
    try:
        return json.loads(f.payload).get("nonce")
    except ValueError:
        return None
