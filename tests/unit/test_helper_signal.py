"""`sbx signal` to a standalone `sbx run` supervisor: no signal is lost when several arrive
before the supervisor takes the first.

The forwarded signal travels as the payload of a signal to the supervisor. A standard signal
is pending at most once: a second one sent before the first is taken is dropped, so SIGSTOP,
SIGCONT and SIGKILL in a row could leave the command stopped. These tests make that window as
wide as they like: the supervisor is held in a ptrace stop (it runs nothing, so it takes
nothing) while the signals are sent, then let go.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sandboxd.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from sandboxd.execution import Executor
from sandboxd.helper_client import HelperResult
from test_helper import Env, env, token  # noqa: F401  (a fixture)

PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def _ptrace(request: int, pid: int) -> None:
    if _libc.ptrace(request, pid, None, None) < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


@contextmanager
def _held(pid: int) -> Iterator[None]:
    """The process `pid` (our child) stopped in a ptrace stop, which SIGCONT does not end:
    what is sent to it meanwhile waits, pending, until it is let go."""
    try:
        _ptrace(PTRACE_SEIZE, pid)
    except OSError as exc:
        pytest.skip(f"ptrace is not allowed here: {exc}")
    try:
        _ptrace(PTRACE_INTERRUPT, pid)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSTOPPED(status), status
        yield
    finally:
        _ptrace(PTRACE_DETACH, pid)


def _supervise(helper: Env, tok: str, script: str, *limit: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            *limit,
            helper.sbx,
            "--root",
            str(helper.root),
            "run",
            "--id",
            tok,
            "--timeout-ms",
            "20000",
            "--",
        ]
        + ["sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


def _lines_within(p: subprocess.Popen, seconds: float) -> int:
    """How many lines the command printed within `seconds` (0: none, it is stopped)."""
    assert p.stdout is not None
    os.set_blocking(p.stdout.fileno(), False)
    got, deadline = b"", time.monotonic() + seconds
    while time.monotonic() < deadline:
        got += p.stdout.read() or b""
        time.sleep(0.05)
    return got.count(b"\n")


@pytest.mark.parametrize("round_", range(3))
def test_stop_cont_kill_sent_together_all_arrive(env: Env, round_: int) -> None:  # noqa: F811
    tok = token()
    with _supervise(env, tok, "echo ready; while :; do sleep 0.05; done") as p:
        try:
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
            with _held(p.pid):
                for name in ("SIGSTOP", "SIGCONT", "SIGKILL"):
                    env.ok("signal", tok, name)
            assert p.wait(timeout=10) == 128 + signal.SIGKILL
        finally:
            p.kill()


def test_cont_after_stop_sent_together_arrives(env: Env) -> None:  # noqa: F811
    tok = token()
    with _supervise(env, tok, "echo ready; while :; do echo tick; sleep 0.05; done") as p:
        try:
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
            with _held(p.pid):
                env.ok("signal", tok, "SIGSTOP")
                env.ok("signal", tok, "SIGCONT")
            _lines_within(p, 0.3)  # what came before the stop took hold
            assert _lines_within(p, 1.0) > 0, "the command was left stopped"
            env.ok("signal", tok, "SIGKILL")
            assert p.wait(timeout=10) == 128 + signal.SIGKILL
        finally:
            p.kill()


def test_a_supervisor_still_takes_an_older_helpers_request(env: Env, tmp_path: Path) -> None:  # noqa: F811
    """A copy of the helper is not the supervisor's executable, so its `sbx signal` asks in
    SIGUSR2, the spelling of the helpers before the queued signal (a supervisor restored from
    an older server's memory checkpoint is asked so too): the supervisor forwards it."""
    other = tmp_path / "bin" / "sbx"
    other.parent.mkdir()
    shutil.copy(env.sbx, other)
    tok = token()
    with _supervise(env, tok, "echo ready; while :; do sleep 0.05; done") as p:
        try:
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
            r = subprocess.run(
                [str(other), "--root", str(env.root), "signal", tok, "SIGKILL"],
                capture_output=True,
                timeout=10,
            )
            assert (r.returncode, r.stderr) == (0, b"")
            assert p.wait(timeout=10) == 128 + signal.SIGKILL
        finally:
            p.kill()


def test_a_request_that_cannot_be_queued_is_an_error(env: Env) -> None:  # noqa: F811
    """A supervisor whose user has as many signals queued as RLIMIT_SIGPENDING allows (its
    commands can queue them) cannot be asked: `sbx signal` says so (KERNEL_LIMIT, which the
    server answers as KERNEL_LIMIT_REACHED), never that it went, and never NOT_FOUND, which
    the server reads as "the process has exited"."""
    tok = token()
    limit = ("prlimit", "--sigpending=0", "--")
    with _supervise(env, tok, "echo ready; while :; do sleep 0.05; done", *limit) as p:
        try:
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
            r = env("signal", tok, "SIGTERM")
            assert (r.rc, r.error) == (1, "KERNEL_LIMIT"), r
            assert p.poll() is None
        finally:
            p.kill()


class _Answers:
    """The helper's one answer to `sbx signal`, as the server's helper client reads it."""

    def __init__(self, stderr: bytes) -> None:
        self.stderr = stderr

    async def run(self, session: object, args: list[str], *, timeout_s: float) -> HelperResult:
        return HelperResult(1, b"", self.stderr)


@pytest.mark.parametrize(
    ("said", "error", "reason"),
    [
        (b'{"error":"NOT_FOUND","message":"no supervisor"}', FailedPrecondition, "PROCESS_EXITED"),
        (
            b'{"error":"KERNEL_LIMIT","message":"queue full"}',
            ResourceExhausted,
            "KERNEL_LIMIT_REACHED",
        ),
        (b'{"error":"EIO","message":"signal x: I/O"}', InvalidArgument, "INVALID_SIGNAL"),
    ],
)
async def test_the_server_names_why_a_signal_did_not_go(
    said: bytes, error: type[Exception], reason: str
) -> None:
    """A full signal queue is a kernel limit the caller can wait out, never "it has exited"."""
    executor = Executor(commands=None, helper=_Answers(said))  # type: ignore[arg-type]
    with pytest.raises(error) as raised:
        await executor.signal(None, "tok", "SIGTERM")  # type: ignore[arg-type]
    assert raised.value.reason == reason  # type: ignore[attr-defined]
