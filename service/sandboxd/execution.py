"""Running commands in a session's container, with output streamed as it is produced.

Every command runs under the `sbx run` supervisor (helper/run.c) inside the container: it
puts the command in its own session and process group, adopts orphans as a subreaper, and
kills every descendant when the command ends. The server keeps the timeout, the output caps
and cancellation: on any of them it runs `sbx kill <token>`, which ends the whole tree.

`Executor.start` hands out a `Command`: its events, its stdin (with a real half-close), signals
and terminal size. Exec and Run, Interact (interactive.py) and background processes
(processes/manager.py) are all built on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import signal
import time
from collections.abc import AsyncIterator

from sandboxd.commands import Detach, DetachedExecs, SandboxCommands, Supervised, Where
from sandboxd.digits import decimal
from sandboxd.engine import ExecStream
from sandboxd.errors import (
    EngineUnavailable,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SandboxError,
)
from sandboxd.exec_spec import (
    PtySize,
    validate_signal,
)
from sandboxd.helper_client import HelperClient, HelperError
from sandboxd.models import (
    ExecEvent,
    ExecExited,
    ExecKeepalive,
    ExecOutput,
    ExecSpec,
    ExecStarted,
    OutputStream,
    Session,
)
from sandboxd.reasons import Reason
from sandboxd.wait_clock import WaitClock

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024  # largest output event; keeps gRPC messages small and latency low
_STREAMS = {1: OutputStream.STDOUT, 2: OutputStream.STDERR}  # by fd, without an Enum call per chunk
SUPERVISOR_GRACE_S = 2.0  # the in-container backstop fires this long after our own timer
KILL_TIMEOUT_S = 5.0
HELPER_TIMEOUT_S = 10.0


def _signal_name(number: int) -> str:
    if 0 < number <= 64:
        with contextlib.suppress(ValueError):
            return signal.Signals(number).name
    return ""


def parse_status(stdout: bytes) -> int:
    """`sbx status`'s answer: the signal the command died of, 0 when it exited."""
    words = stdout.decode(errors="replace").split()
    signal = decimal(words[1], max_digits=3) if len(words) == 2 and words[0] == "signal" else None
    return signal or 0


GAP_FD = 16  # (fd + GAP_FD, length) from a stream: `length` bytes of fd lost on the way


def new_token() -> str:
    """The id `sbx run --id` is started with; `sbx kill`/`signal` find the supervisor by it."""
    return "p-" + secrets.token_hex(8)


class Command:
    """One command started under `sbx run`: its output events, stdin, signals, terminal size.

    Made by `Executor.start`, which kills the command's tree if it is left before `exited`.
    """

    def __init__(
        self,
        executor: Executor,
        session: Session,
        spec: ExecSpec,
        process_id: str,
        token: str,
        stream: ExecStream,
        tty: bool,
    ) -> None:
        self._executor = executor
        self._session = session
        self._spec = spec
        self.process_id = process_id
        self.token = token
        self._stream = stream
        self.tty = tty
        self.started = time.monotonic()
        self.finished = False
        self.stdin_closed = False
        self.kept_by_agent = False  # a detached exec: the sandbox's agent holds its output
        self._failure: SandboxError | None = None
        # The clock of the reads for output (`events`): `fail` ends the one in progress.
        self._clock: WaitClock | None = None
        self._feeder: asyncio.Task[None] | None = None

    # ----- input ------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Write `data` to stdin in the background, then half-close it (Exec, Run); with no
        data, the half-close at once (no task for it)."""
        if not data:
            with contextlib.suppress(SandboxError, ConnectionError):
                self.close_stdin()
            return
        self._feeder = asyncio.create_task(self._feed(data))

    async def _feed(self, data: bytes) -> None:
        with contextlib.suppress(SandboxError, ConnectionError):
            if data:
                await self._stream.write(data)
        self.close_stdin()

    async def write(self, data: bytes) -> None:
        if self.stdin_closed:
            raise FailedPrecondition(
                "stdin of this command is already closed", reason=Reason.STDIN_CLOSED
            )
        if data:
            # A command that has exited no longer reads: its `exited` event is on the way (and
            # a real engine failure surfaces from the output side).
            with contextlib.suppress(ConnectionError, EngineUnavailable):
                await self._stream.write(data)

    def close_stdin(self) -> None:
        """Half-close: the command sees EOF on stdin while its output keeps flowing."""
        self.stdin_closed = True
        self._stream.close_stdin()

    async def signal(self, name: str) -> None:
        await self._executor.signal(self._session, self.token, validate_signal(name))

    async def resize(self, size: PtySize) -> None:
        if not self.tty:
            raise FailedPrecondition(
                "resize needs a terminal: start the command with a pty",
                reason=Reason.NOT_A_TERMINAL,
            )
        if self.finished:
            return  # the terminal is gone with the command: nothing to resize
        try:
            await self._executor.commands.resize(self._stream.exec_id, size.rows, size.cols)
        except SandboxError:
            # The command ended between the check and the call (the engine refuses a resize
            # of an exec that is not running): a no-op, like the one above.
            if (await self._executor.commands.status(self._stream.exec_id)).running:
                raise

    def fail(self, exc: SandboxError) -> None:
        """End `events` with `exc` (a bad control message): the caller gets the error."""
        self._failure = exc
        if self._clock is not None:
            # Wake the reader waiting for output; a busy one checks the flag before its next wait.
            self._clock.fire()

    # ----- output -----------------------------------------------------------------------

    async def events(
        self, *, keepalive_s: float | None = None, cap_output: bool = True
    ) -> AsyncIterator[ExecEvent]:
        """started, output..., exited; `keepalive` after each quiet `keepalive_s`.

        With `cap_output` output past `max_output_bytes` is cut and the command killed;
        without it (background processes keep a ring buffer instead) output is never cut.
        """
        spec = self._spec
        yield ExecStarted(self.process_id)
        offsets = {1: 0, 2: 0}
        timed_out = truncated = False
        stream = self._stream
        # Straight from the stream, in this task: no pump task and queue between (one task
        # switch less per chunk). Its buffer is the backpressure (the agent's window, or the
        # engine's socket): what it holds unread stays there, and a read cut by the clock takes
        # nothing from it. One clock for every read (a keepalive after each quiet
        # `keepalive_s`, the command's deadline), not a timeout per read: no timer per chunk.
        loop_deadline = asyncio.get_running_loop().time() + (
            self.started + spec.timeout_s - time.monotonic()
        )
        clock = self._clock = WaitClock(
            math.inf if keepalive_s is None else keepalive_s, loop_deadline
        )
        try:
            while True:
                if self._failure is not None:
                    raise self._failure
                if clock.past_deadline():
                    timed_out = True
                    break
                clock.begin()
                try:
                    item = await stream.read()
                except asyncio.CancelledError:
                    if not clock.expired():
                        raise
                    if self._failure is None and not clock.past_deadline():
                        yield ExecKeepalive()  # quiet for keepalive_s
                    continue
                finally:
                    clock.end()
                if item is None:
                    break
                fd, data = item
                if fd not in offsets:
                    if (
                        g := fd - GAP_FD
                    ) in offsets:  # bytes lost on the way (commands/detached.py)
                        offsets[g] += int.from_bytes(data, "big")
                        if cap_output and offsets[g] >= spec.max_output_bytes:
                            offsets[g], truncated = spec.max_output_bytes, True
                        yield ExecOutput(_STREAMS[g], b"", offsets[g])
                        if truncated:
                            break
                    continue  # not an output stream (the engine only sends 1 and 2)
                if cap_output:
                    room = spec.max_output_bytes - offsets[fd]
                    if len(data) > room:
                        data, truncated = data[:room], True
                for i in range(0, len(data), CHUNK_BYTES):
                    piece = data[i : i + CHUNK_BYTES] if len(data) > CHUNK_BYTES else data
                    yield ExecOutput(_STREAMS[fd], piece, offsets[fd])
                    offsets[fd] += len(piece)
                if truncated:
                    break
        finally:
            clock.stop()
            self._clock = None
        signal_name = ""
        if timed_out or truncated:
            await self._kill_draining()
            exit_code = 137
            signal_name = "SIGKILL"
        else:
            exit_code = await self._stream.wait_exit_code()
            if 128 < exit_code <= 128 + 64:
                # `exit 130` and death by SIGINT look alike here: only the supervisor's
                # status record tells them apart.
                signal_name = await self._executor.exit_signal(self._session, self.token)
                if exit_code == 137 and not signal_name:
                    # Not asked for by us and no record: the supervisor itself was killed,
                    # maybe leaving orphans of the command behind.
                    await self._executor.reap(self._session)
        self.finished = True
        yield ExecExited(
            exit_code=exit_code,
            signal=signal_name,
            timed_out=timed_out,
            truncated=truncated,
            duration_s=time.monotonic() - self.started,
        )

    async def _kill_draining(self) -> None:
        """Kill the tree while reading (and dropping) the output still coming.

        The engine handles an exec's exit only once its output is copied out, waiting up to
        2 s and holding up the container's other execs meanwhile, our `sbx kill` among them.
        """

        async def drain() -> None:
            with contextlib.suppress(SandboxError, ConnectionError):
                while await self._stream.read() is not None:
                    pass

        drainer = asyncio.create_task(drain())
        try:
            await self._executor.kill(self._session, self.token, self._stream.exec_id)
            await asyncio.wait({drainer}, timeout=1.0)  # to the end of output, briefly
        finally:
            drainer.cancel()

    async def _stop(self) -> None:
        task = self._feeder
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, SandboxError, ConnectionError):
                await task


class Executor:
    """Starts commands and owns the kill tasks that must finish even if a caller goes away."""

    def __init__(
        self,
        commands: SandboxCommands,
        helper: HelperClient | None = None,
        detached: DetachedExecs | None = None,
    ) -> None:
        self.commands = commands
        self.helper = helper or HelperClient(commands)
        self.detached = detached  # background processes the sandbox's agent keeps
        self._kills: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        if self._kills:
            await asyncio.wait(self._kills, timeout=KILL_TIMEOUT_S)

    def kill(self, session: Session, token: str, exec_id: str) -> asyncio.Task[None]:
        """End the command's process tree; completes even if the caller is cancelled."""
        task = asyncio.create_task(self._kill(session, token, exec_id))
        self._kills.add(task)
        task.add_done_callback(self._kills.discard)
        return task

    async def _kill(self, session: Session, token: str, exec_id: str) -> None:
        """`sbx kill` until it hits, or until the engine says the exec has ended.

        A kill right after the start can come before the engine has started `sbx run`: then
        no supervisor is found yet, and the kill is tried again.
        """
        try:
            async with asyncio.timeout(KILL_TIMEOUT_S):
                for delay in (0, 0.01, 0.02, 0.05, *([0.1] * 50)):
                    await asyncio.sleep(delay)
                    code, _ = await self._helper(session, ["kill", token], KILL_TIMEOUT_S)
                    if code == 0:
                        return
                    status = await self.commands.status(exec_id)
                    if not status.running and status.exit_code is not None:
                        return  # it has ended by itself
        except (NotFound, FailedPrecondition) as exc:
            log.debug("process %s: container gone: %s", token, exc)  # its processes too
        except (SandboxError, TimeoutError) as exc:
            log.warning("could not kill process %s: %s", token, exc)

    async def signal(self, session: Session, token: str, name: str) -> None:
        """Deliver `name` to the process group of the command started with `token`."""
        code, err = await self._helper(session, ["signal", token, name], HELPER_TIMEOUT_S)
        if code == 0:
            return
        if err is not None and err.name == "NOT_FOUND":
            raise FailedPrecondition("the process has already exited", reason=Reason.PROCESS_EXITED)
        if err is not None and err.name == "KERNEL_LIMIT":
            raise ResourceExhausted(err.message[:200], reason=Reason.KERNEL_LIMIT_REACHED)
        said = f"{err.name}: {err.message}" if err is not None else "no reason given"
        raise InvalidArgument(
            f"sbx signal failed ({code}): {said[:200]}", reason=Reason.INVALID_SIGNAL
        )

    async def exit_signal(self, session: Session, token: str) -> str:
        """The signal the command started with `token` died of, as the supervisor saw it;
        "" when it exited by itself (or the record cannot be read: the code still stands)."""
        try:
            result = await self.helper.run(session, ["status", token], timeout_s=HELPER_TIMEOUT_S)
        except SandboxError as exc:
            log.warning("process %s: no status record: %s", token, exc)
            return ""
        return _signal_name(parse_status(result.stdout)) if result.exit_code == 0 else ""

    async def reap(self, session: Session) -> None:
        """Kill what a killed supervisor left behind (`sbx reap`); best effort."""
        try:
            await self.helper.run(session, ["reap"], timeout_s=HELPER_TIMEOUT_S)
        except SandboxError as exc:
            log.warning("session %s: reap failed: %s", session.session_id, exc)

    async def _helper(
        self, session: Session, args: list[str], timeout_s: float
    ) -> tuple[int, HelperError | None]:
        """Run `sbx ARGS` as the session user; its exit code and its error, if it said one."""
        result = await self.helper.run(session, args, timeout_s=timeout_s)
        return result.exit_code, result.error

    @contextlib.asynccontextmanager
    async def start(
        self,
        session: Session,
        spec: ExecSpec,
        *,
        process_id: str = "",
        token: str = "",
        pty: PtySize | None = None,
        detach: Detach | None = None,
        stdin_ends: bool = False,
    ) -> AsyncIterator[Command]:
        """Start `spec` and yield its Command; leaving before `exited` kills its tree. With
        `detach` (and an agent) the command outlives a server that dies (processes/manager.py).
        `stdin_ends`: the caller writes no stdin (its EOF may go with the start)."""
        token = token or new_token()
        supervised = Supervised(
            tuple(spec.argv),
            token=token,
            timeout_ms=int((spec.timeout_s + SUPERVISOR_GRACE_S) * 1000),
            cwd=spec.cwd,
            env=spec.env,
            pty=(pty.rows, pty.cols) if pty is not None else None,
            stdin_ends=stdin_ends,
        )
        user, cid = session.spec.user, session.container_id
        kept = bool(detach and self.detached and await self.detached.serves(cid, user))
        async with (
            self.detached.exec(cid, supervised, detach=detach)
            if detach and self.detached and kept
            else self.commands.open(Where(cid, user), supervised, stdin=True)
        ) as stream:
            command = Command(
                self, session, spec, process_id or token, token, stream, tty=pty is not None
            )
            command.kept_by_agent = kept
            try:
                yield command
            finally:
                if not command.finished:
                    # The caller went away (or failed): the command must not outlive the call.
                    self.kill(session, token, stream.exec_id)
                await command._stop()

    async def stream(
        self, session: Session, spec: ExecSpec, *, keepalive_s: float | None = None
    ) -> AsyncIterator[ExecEvent]:
        """Run `spec` and yield started, output..., exited. Closing the generator kills it."""
        async with self.start(session, spec, stdin_ends=not spec.stdin) as command:
            command.feed(spec.stdin)
            async for event in command.events(keepalive_s=keepalive_s):
                yield event
