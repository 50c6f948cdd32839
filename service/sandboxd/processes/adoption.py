"""Background processes that outlived the server: on start, each running session's
agent lists the detached processes it kept, and each becomes a `BackgroundProcess` again,
followed from the oldest byte the agent still holds (AttachProcess from 0 replays it), with its
exit recorded when it comes.

What the server knew of a process (its argv, cwd) is read back from the command line of its
`sbx run` supervisor while it runs; a process that ended meanwhile keeps its output and exit,
with an empty argv. Its clock comes from the agent's record (`KeptClock`): the server kills at
the deadline (the supervisor is only a backstop, SUPERVISOR_GRACE_S later), so a server started
again must keep the deadline the first one set, not count a fresh timeout from its own start;
and a process that ran past its deadline while no server was there and died of SIGKILL was
killed for it (the backstop), which its record says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from sandboxd.commands import DetachedExecs, Plain, Where
from sandboxd.errors import SandboxError
from sandboxd.execution import SUPERVISOR_GRACE_S, Command, Executor
from sandboxd.models import ExecExited, ExecOutput, ExecSpec, Session, SessionState
from sandboxd.processes.record import AgentKept, BackgroundProcess, ProcessOrigin, StartOptions
from sandboxd.validation.identity import SESSION_ID_RE

log = logging.getLogger(__name__)

UNKNOWN_TIMEOUT_S = 7 * 24 * 3600.0  # the supervisor enforces the real one itself
CMDLINE_BYTES = 256 * 1024


AGENT_RING_MAX = 64 * 1024 * 1024  # the agent's bound of a detached ring


AGENT_RING_SLACK = 1024 * 1024


def agent_ring(proc: BackgroundProcess) -> int:
    """The agent's ring per stream (in the sandbox's memory, touched only as it fills): at
    least the server's ring plus slack, so that the live stream loses nothing a server that
    keeps up would have kept; for a capped process all it may write plus slack (it writes on
    until the server's kill lands)."""
    size = proc.options.buffer_bytes
    if proc.options.cap_output:
        size = max(size, proc.spec.max_output_bytes)
    return max(1, min(size + AGENT_RING_SLACK, AGENT_RING_MAX))


def agent_ring_held(record: dict[str, Any]) -> int:
    """How much of each stream an adopted process offers to AttachProcess: what its agent's
    ring holds once full (`end - start` of the listing), else all of it up to AGENT_RING_MAX
    (its ring size is not in the record; readers get the agent's `start` either way)."""
    start, end = record.get("start"), record.get("end")
    held = [
        e - s
        for fd in ("1", "2")
        if isinstance(start, dict)
        and isinstance(end, dict)
        and isinstance(s := start.get(fd), int)
        and isinstance(e := end.get(fd), int)
        and s > 0
        and e > s
    ]
    return max(held, default=AGENT_RING_MAX)


def detach_id(process_id: str, token: str) -> str:
    """The agent's id of a background process: its process id, which is its `sbx run` token
    too (both fit the agent's rule for ids: 1..64 of A-Z a-z 0-9 . _ : -)."""
    return process_id


def parse_detach_id(value: str) -> tuple[str, str] | None:
    """(process id, token) of an agent's record; None for one that is not a process id."""
    return (value, value) if SESSION_ID_RE.match(value) else None


@dataclass(frozen=True)
class KeptClock:
    """A kept process's time from its agent's record: how long ago it started, how long it ran
    (None: it runs), and the server's timeout for it (None: an agent that does not keep it).
    Ages, not clock times: the agent counts them on the sandbox's monotonic clock, so neither a
    server's clock nor an engine host's that differs from it matters."""

    age_s: float | None = None
    ran_s: float | None = None
    timeout_s: float | None = None

    def started_monotonic(self, now: float) -> float | None:
        """When it started on this server's monotonic clock (None: not known)."""
        return None if self.age_s is None else now - self.age_s


def _ms(record: dict[str, Any], key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value / 1000


def paused_within(pauses: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of the memory suspends (epoch-second spans) that fall within [start, end]."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in pauses)


def kept_clock(
    record: dict[str, Any], pauses: Sequence[tuple[float, float]] = (), now: float | None = None
) -> KeptClock:
    """The agent's clock of a kept process, less the time its sandbox spent suspended with its
    memory (`pauses`): the sandbox's monotonic clock jumps by that time at a restore, and a
    timeout does not count it."""
    age, ran = _ms(record, "age_ms"), _ms(record, "ran_ms")
    if pauses and age is not None:
        now = time.time() if now is None else now
        started = now - age  # the sandbox's clock ran on through the pauses: a real age
        ended = started + ran if ran is not None else now
        age -= paused_within(pauses, started, now)
        if ran is not None:
            ran -= paused_within(pauses, started, ended)
    return KeptClock(age, ran, _ms(record, "timeout_ms"))


def adopted_spec(spec: ExecSpec, clock: KeptClock, running: bool) -> ExecSpec:
    """The spec an adopted process is followed with: its own timeout (the agent's record, else
    the supervisor's command line) while it runs; none once it ended (its exit is read as it
    was, never cut by a deadline that passed while no one read it)."""
    if not running:
        return replace(spec, timeout_s=UNKNOWN_TIMEOUT_S)
    if clock.timeout_s is not None:
        return replace(spec, timeout_s=clock.timeout_s)
    return spec


def adopted_exit(exited: ExecExited, clock: KeptClock, spec_timeout_s: float | None) -> ExecExited:
    """The exit of a process that ended while no server was there, as it happened: its real
    duration, and a SIGKILL past its deadline recorded as the timeout it was."""
    if clock.ran_s is None:
        return exited
    timeout = clock.timeout_s if clock.timeout_s is not None else spec_timeout_s
    killed = exited.exit_code == 137 and exited.signal in ("", "SIGKILL")
    if killed and timeout is not None and clock.ran_s >= timeout:
        return replace(exited, signal="SIGKILL", timed_out=True, duration_s=clock.ran_s)
    return replace(exited, duration_s=clock.ran_s)


def spec_from_cmdline(cmdline: bytes, buffer_bytes: int) -> ExecSpec:
    """`sbx run --id T --timeout-ms N --cwd D [--tty RxC] -- ARGV...` back into a spec; the
    supervisor's backstop is SUPERVISOR_GRACE_S past the server's timeout, which is the one."""
    args = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    timeout_s, cwd, argv = UNKNOWN_TIMEOUT_S, "/workspace", []
    if "--" in args:
        head, argv = args[: args.index("--")], args[args.index("--") + 1 :]
        opts = dict(zip(head[2::2], head[3::2], strict=False))
        with contextlib.suppress(ValueError):
            timeout_s = max(0.0, int(opts.get("--timeout-ms", "")) / 1000 - SUPERVISOR_GRACE_S)
        cwd = opts.get("--cwd", cwd)
    return ExecSpec(argv, cwd, {}, b"", timeout_s, buffer_bytes)


async def read_cmdline(executor: Executor, session: Session, pid: int) -> bytes:
    out = bytearray()
    with contextlib.suppress(SandboxError, TimeoutError):
        async with asyncio.timeout(5):
            async with executor.commands.open(
                Where(session.container_id, session.spec.user),
                Plain(("/bin/cat", f"/proc/{pid}/cmdline")),
            ) as stream:
                while (chunk := await stream.read()) is not None:
                    if chunk[0] == 1 and len(out) < CMDLINE_BYTES:
                        out += chunk[1]
    return bytes(out)


async def kept_processes(
    detached: DetachedExecs, session: Session
) -> list[tuple[str, str, dict[str, Any]]]:
    """(process id, token, record) of each detached process the session's agent kept."""
    if not await detached.serves(session.container_id, session.spec.user):
        return []
    found = []
    for record in await detached.listing(session.container_id):
        ids = parse_detach_id(str(record.get("id", "")))
        if ids is not None:
            found.append((*ids, record))
    return found


async def adopted_record(
    executor: Executor,
    session: Session,
    ids: tuple[str, str],
    record: dict[str, Any],
    buffer_bytes: int,
) -> tuple[BackgroundProcess, KeptClock]:
    """The record of a kept process as the server that started it had it: its spec, its real
    start, its output in the agent's ring; and its clock, which `follow` keeps."""
    process_id, token = ids
    pid, running = record.get("pid"), record.get("running") is True
    cmdline = b""
    if running and isinstance(pid, int):
        cmdline = await read_cmdline(executor, session, pid)
    clock = kept_clock(record, session.pauses)
    spec = adopted_spec(spec_from_cmdline(cmdline, buffer_bytes), clock, running)
    proc = BackgroundProcess(
        session.session_id,
        process_id,
        spec,
        StartOptions(spec.max_output_bytes),
        ProcessOrigin.START_PROCESS,
        token=token,
    )
    if clock.age_s is not None:  # its real start, not the adoption's
        proc.started_at -= timedelta(seconds=clock.age_s)
    kept = AgentKept(session.container_id, detach_id(process_id, token), agent_ring_held(record))
    proc.keep_in_agent(kept)
    return proc, clock


class AdoptionGate:
    """Calls on a session's processes wait until a server that starts has adopted what its
    agent kept: else, right after a restart, a running process is NOT_FOUND and a StartProcess
    of its id starts it a second time. Closed before the server serves its first call; each
    session opens when its adoption ends (failed or not), all of them when adoption ends, and
    a wait is bounded (`wait`'s timeout): an agent that does not answer delays, never hangs."""

    def __init__(self) -> None:
        self._open = True
        self._pending: set[str] | None = None  # None: not listed yet, every session waits
        self._changed = asyncio.Event()

    def close(self) -> None:
        self._open, self._pending = False, None

    def expect(self, session_ids: Iterable[str]) -> None:
        self._pending = set(session_ids)
        self._wake()

    def done(self, session_id: str) -> None:
        if self._pending is not None:
            self._pending.discard(session_id)
        self._wake()

    def finish(self) -> None:
        self._open = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def waiting(self, session_id: str) -> bool:
        return not self._open and (self._pending is None or session_id in self._pending)

    async def wait(self, session_id: str, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.waiting(session_id):
                    await self._changed.wait()


async def adopt_all(
    running: list[Session], adopt: Callable[[Session], Awaitable[int]], gate: AdoptionGate
) -> None:
    """Adopt each running session's kept processes, one session at a time, each failure its
    session's only; each session's calls wait (`gate`) until its own adoption ended."""
    gate.expect(s.session_id for s in running)
    try:
        for session in running:
            try:
                if n := await adopt(session):
                    log.info("session %s: %d background processes adopted", session.session_id, n)
            except (SandboxError, ConnectionError, TimeoutError) as exc:
                log.warning(
                    "session %s: background processes not adopted: %s", session.session_id, exc
                )
            finally:
                gate.done(session.session_id)
    finally:
        gate.finish()


def running_sessions(sessions: Iterable[Session]) -> list[Session]:
    return [s for s in sessions if s.state is SessionState.RUNNING and s.container_id]


async def follow(
    executor: Executor, session: Session, proc: BackgroundProcess, clock: KeptClock
) -> None:
    """An adopted process's output from the agent's ring into its record, then live, then
    its exit. Its deadline is the one it started with (`clock`): past it, it is killed at
    once and recorded timed out. Leaving early (the session ends, the server shuts down) kills
    it, as for any background process."""
    assert executor.detached is not None
    async with executor.detached.attach(
        session.container_id, detach_id(proc.process_id, proc.token)
    ) as stream:
        command = Command(
            executor, session, proc.spec, proc.process_id, proc.token, stream, tty=False
        )
        if (started := clock.started_monotonic(time.monotonic())) is not None:
            command.started = started
        try:
            async for event in command.events(cap_output=False):
                if isinstance(event, ExecOutput):
                    proc.append_at(event.stream, event.offset, event.data)
                elif isinstance(event, ExecExited):
                    # Cut by its deadline, it may not have been read to its end here (the
                    # deadline passed while no server was there): the agent's copy says.
                    event = adopted_exit(event, clock, proc.spec.timeout_s)
                    proc.finish(event, complete=not event.timed_out)
        finally:
            if not command.finished:
                executor.kill(session, proc.token, stream.exec_id)
            await command._stop()
