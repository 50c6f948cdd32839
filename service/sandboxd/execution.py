"""Running commands in a session's container, with output streamed as it is produced.

Every command runs under the `sbx run` supervisor (helper/sbx.c) inside the container: it
puts the command in its own session and process group, adopts orphans as a subreaper, and
kills every descendant when the command ends. The server keeps the timeout, the output caps
and cancellation: on any of them it runs `sbx kill <id>`, which ends the whole tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sandboxd import validation
from sandboxd.engine import Engine, ExecStream
from sandboxd.errors import InvalidArgument, SandboxError
from sandboxd.models import (
    ExecEvent,
    ExecExited,
    ExecOutput,
    ExecSpec,
    ExecStarted,
    Limits,
    OutputStream,
    Session,
)
from sandboxd.profile import HELPER_IN_CONTAINER

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024  # largest output event; keeps gRPC messages small and latency low
QUEUE_CHUNKS = 64  # chunks buffered between the engine and a slow client: backpressure
SUPERVISOR_GRACE_S = 2.0  # the in-container backstop fires this long after our own timer
KILL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ExecRequestInput:
    argv: list[str]
    cwd: str = ""
    env: dict[str, str] | None = None
    stdin: bytes = b""
    timeout_s: float | None = None
    max_output_bytes: int | None = None


def prepare(session: Session, req: ExecRequestInput, max_limits: Limits) -> ExecSpec:
    """Validate a command against the rules and the session's policy; nothing runs yet."""
    argv = validation.validate_argv(req.argv)
    cwd = validation.validate_cwd(req.cwd)
    env = validation.validate_env(req.env or {})
    validation.check_command_allowed(
        argv[0], session.spec.shell.allow, session.spec.shell.allow_all
    )
    limits = session.spec.limits
    timeout = limits.command_timeout_s if req.timeout_s is None else req.timeout_s
    if timeout <= 0:
        raise InvalidArgument("timeout must be positive", reason="INVALID_TIMEOUT")
    if timeout > max_limits.command_timeout_s:
        raise InvalidArgument(
            f"timeout of {timeout:g} s is above the server maximum of "
            f"{max_limits.command_timeout_s:g} s",
            reason="LIMIT_EXCEEDS_MAXIMUM",
            metadata={"limit": "timeout", "maximum": f"{max_limits.command_timeout_s:g}s"},
        )
    cap = limits.output_bytes if req.max_output_bytes is None else req.max_output_bytes
    if cap <= 0:
        raise InvalidArgument("max_output_bytes must be positive", reason="INVALID_OUTPUT_CAP")
    if cap > limits.output_bytes:
        raise InvalidArgument(
            f"max_output_bytes {cap} is above the session's output cap {limits.output_bytes}",
            reason="LIMIT_EXCEEDS_MAXIMUM",
            metadata={"limit": "max_output_bytes", "maximum": str(limits.output_bytes)},
        )
    if len(req.stdin) > limits.file_bytes:
        raise InvalidArgument(
            f"stdin of {len(req.stdin)} bytes is over the session's file cap {limits.file_bytes}",
            reason="STDIN_TOO_LARGE",
        )
    return ExecSpec(
        argv=argv, cwd=cwd, env=env, stdin=req.stdin, timeout_s=timeout, max_output_bytes=cap
    )


def _signal_name(exit_code: int) -> str:
    if 128 < exit_code <= 128 + 64:
        with contextlib.suppress(ValueError):
            return signal.Signals(exit_code - 128).name
    return ""


class Executor:
    """Starts commands and owns the kill tasks that must finish even if a caller goes away."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._kills: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        if self._kills:
            await asyncio.wait(self._kills, timeout=KILL_TIMEOUT_S)

    def kill(self, session: Session, process_id: str) -> asyncio.Task[None]:
        """End the command's process tree; completes even if the caller is cancelled."""
        task = asyncio.create_task(self._kill(session, process_id))
        self._kills.add(task)
        task.add_done_callback(self._kills.discard)
        return task

    async def _kill(self, session: Session, process_id: str) -> None:
        try:
            async with asyncio.timeout(KILL_TIMEOUT_S):
                async with self._engine.exec(
                    session.container_id,
                    [HELPER_IN_CONTAINER, "kill", process_id],
                    user=session.spec.user,
                ) as stream:
                    while await stream.read() is not None:
                        pass
        except (SandboxError, TimeoutError) as exc:
            log.warning("could not kill process %s: %s", process_id, exc)

    async def stream(self, session: Session, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
        """Run `spec` and yield started, output..., exited. Closing the generator kills it."""
        process_id = "p-" + secrets.token_hex(8)
        argv = [
            HELPER_IN_CONTAINER,
            "run",
            "--id",
            process_id,
            "--timeout-ms",
            str(int((spec.timeout_s + SUPERVISOR_GRACE_S) * 1000)),
            "--cwd",
            spec.cwd,
            "--",
            *spec.argv,
        ]
        started = time.monotonic()
        finished = False
        async with self._engine.exec(
            session.container_id,
            argv,
            user=session.spec.user,
            env=spec.env,
            stdin=True,
        ) as stream:
            feeder = asyncio.create_task(self._feed_stdin(stream, spec.stdin))
            queue: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue(QUEUE_CHUNKS)
            pump = asyncio.create_task(self._pump(stream, queue))
            try:
                yield ExecStarted(process_id)
                offsets = {1: 0, 2: 0}
                timed_out = truncated = False
                deadline = started + spec.timeout_s
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        timed_out = True
                        break
                    try:
                        item = await asyncio.wait_for(queue.get(), timeout=remaining)
                    except TimeoutError:
                        timed_out = True
                        break
                    if item is None:
                        break
                    fd, data = item
                    room = spec.max_output_bytes - offsets[fd]
                    if len(data) > room:
                        data, truncated = data[:room], True
                    for i in range(0, len(data), CHUNK_BYTES):
                        piece = data[i : i + CHUNK_BYTES]
                        yield ExecOutput(OutputStream(fd), piece, offsets[fd])
                        offsets[fd] += len(piece)
                    if truncated:
                        break
                if timed_out or truncated:
                    await self.kill(session, process_id)
                    exit_code = 137
                else:
                    await pump  # surfaces an engine error raised while reading
                    exit_code = await self._exit_code(stream)
                finished = True
                yield ExecExited(
                    exit_code=exit_code,
                    signal="SIGKILL" if timed_out or truncated else _signal_name(exit_code),
                    timed_out=timed_out,
                    truncated=truncated,
                    duration_s=time.monotonic() - started,
                )
            finally:
                if not finished:
                    # The caller went away (or failed): the command must not outlive the call.
                    self.kill(session, process_id)
                for task in (feeder, pump):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, SandboxError):
                        await task

    @staticmethod
    async def _feed_stdin(stream: ExecStream, data: bytes) -> None:
        with contextlib.suppress(SandboxError, ConnectionError):
            if data:
                await stream.write(data)
        stream.close_stdin()

    @staticmethod
    async def _pump(stream: ExecStream, queue: asyncio.Queue[tuple[int, bytes] | None]) -> None:
        """Engine -> bounded queue; when the queue is full the engine socket is not read."""
        try:
            while (item := await stream.read()) is not None:
                await queue.put(item)
        except asyncio.CancelledError:
            raise
        except BaseException:
            await queue.put(None)  # wake the reader; awaiting the pump re-raises the error
            raise
        await queue.put(None)

    async def _exit_code(self, stream: ExecStream) -> int:
        # The output ends a moment before the engine records the exit code.
        for delay in (0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5):
            if delay:
                await asyncio.sleep(delay)
            code = await stream.exit_code()
            if code is not None:
                return code
        return -1
