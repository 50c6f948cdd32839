"""Background processes whose output the sandbox's agent keeps (processes/manager.py,
processes/follow.py): the server holds no ring, only a live tail while the process runs;
AttachProcess reads the tail where its cursors are within it, else the agent's ring from them,
and the agent's record goes when the server's does.

The agent here is an in-memory stand-in for engine.protocol.DetachedExecs that keeps a ring per
fd as the agent does (the last `capacity` bytes, by absolute offset; attach clamps the offsets
into what it holds and reports the loss as (fd + GAP_FD, length), as commands/detached.py does)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import pytest
from sandboxd.agent import memory
from sandboxd.errors import Internal, InvalidArgument, OutOfRange
from sandboxd.execution import GAP_FD
from sandboxd.models import ExecExited, ExecKeepalive, ExecOutput, ExecSpec, ExecStarted
from sandboxd.models import OutputStream as S
from sandboxd.processes import ProcessManager
from sandboxd.processes import budget as room
from sandboxd.processes import follow as process_agent_output
from sandboxd.processes import manager as processes
from sandboxd.processes import record as process_record
from sandboxd.processes.follow import follow
from sandboxd.processes.record import (
    AgentKept,
    AttachEvent,
    BackgroundProcess,
    OutputGap,
)
from sandboxd.reasons import Reason

MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def _small_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1 MiB live tail: the tests move readers on and off it with a few MiB."""
    monkeypatch.setattr(process_record, "TAIL_BYTES", MiB)


_PIECE = 100_000  # not a divisor of the tail's size: switches fall inside a piece


class _Ring:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.data = bytearray()  # the last `capacity` bytes
        self.end = 0

    @property
    def start(self) -> int:
        return self.end - len(self.data)

    def write(self, chunk: bytes) -> None:
        self.data += chunk
        self.end += len(chunk)
        del self.data[: max(0, len(self.data) - self.capacity)]


class _Attached:
    def __init__(self, rings: dict[int, _Ring], offsets: Mapping[int, int]) -> None:
        self.exec_id = "attach"
        self.start = {fd: r.start for fd, r in rings.items()}
        self.end = {fd: r.end for fd, r in rings.items()}
        self._items: list[tuple[int, bytes]] = []
        for fd, ring in rings.items():
            at = offsets.get(fd, 0)
            if at < ring.start:
                self._items.append((fd + GAP_FD, (ring.start - at).to_bytes(8, "big")))
                at = ring.start
            at = min(at, ring.end)
            held = bytes(ring.data[at - ring.start :])
            # In pieces, as the agent's DATA frames come: a reader may switch between two.
            for i in range(0, len(held), _PIECE):
                self._items.append((fd, held[i : i + _PIECE]))

    async def read(self) -> tuple[int, bytes] | None:
        return self._items.pop(0) if self._items else None


class _Agent:
    def __init__(self) -> None:
        self.rings: dict[str, dict[int, _Ring]] = {}
        self.forgotten: list[str] = []
        self.open_streams = 0
        self.attaches = 0

    def add(self, detach_id: str, capacity: int) -> dict[int, _Ring]:
        self.rings[detach_id] = {1: _Ring(capacity), 2: _Ring(capacity)}
        return self.rings[detach_id]

    async def serves(self, container_id: str, user: str) -> bool:
        return True

    @contextlib.asynccontextmanager
    async def attach(
        self, container_id: str, detach_id: str, offsets: Mapping[int, int] | None = None
    ) -> AsyncIterator[_Attached]:
        self.open_streams += 1
        self.attaches += 1
        try:
            yield _Attached(self.rings[detach_id], offsets or {})
        finally:
            self.open_streams -= 1

    async def forget(self, container_id: str, detach_id: str) -> None:
        self.forgotten.append(detach_id)
        del self.rings[detach_id]


class _Executor:
    def __init__(self, agent: _Agent) -> None:
        self.detached = agent


def _spec() -> ExecSpec:
    return ExecSpec(["sh"], ".", {}, b"", 10, 1000)


async def _kept(agent: _Agent, name: str, retention: int, capacity: int) -> BackgroundProcess:
    proc = BackgroundProcess("s", name, _spec())
    proc.keep_in_agent(AgentKept("c", name, retention))
    agent.add(name, capacity)
    return proc


def _produce(agent: _Agent, proc: BackgroundProcess, fd: int, data: bytes) -> None:
    """The process writes: the agent's ring takes it, the server's reader sees the offsets."""
    ring = agent.rings[proc.process_id][fd]
    proc.append_at(S(fd), ring.end, data)
    ring.write(data)


async def _all(events: AsyncIterator[AttachEvent]) -> list[AttachEvent]:
    return [e async for e in events]


async def test_the_server_holds_no_output_and_attach_replays_from_the_agent() -> None:
    agent = _Agent()
    proc = await _kept(agent, "p", retention=64 * MiB, capacity=64 * MiB + MiB)
    for _ in range(64):
        _produce(agent, proc, 1, b"x" * MiB)
    _produce(agent, proc, 2, b"err")
    pm = ProcessManager(_Executor(agent))  # type: ignore[arg-type]
    pm._records_for("s")["p"] = proc
    # While it runs the server holds only the live tail, whatever the process wrote.
    assert pm.held_bytes() == MiB + 3 and proc.retained_bytes() == 0
    assert (proc.end(S.STDOUT), proc.first_offset(S.STDOUT)) == (64 * MiB, 0)
    proc.finish(ExecExited(0, "", False, False, 1.0), complete=True)
    assert pm.held_bytes() == 0
    events = await _all(pm.follow(proc, 0, 0, 5))
    assert events[0] == ExecStarted("p") and events[-1] == proc.exited
    out = b"".join(e.data for e in events if isinstance(e, ExecOutput) and e.stream is S.STDOUT)
    assert out == b"x" * 64 * MiB
    assert ExecOutput(S.STDERR, b"err", 0) in events
    assert agent.open_streams == 0  # each reader's stream is closed when it is done


async def test_output_older_than_the_ring_is_a_gap_and_offsets_are_checked() -> None:
    agent = _Agent()
    # The agent's ring has slack over the process's ring (1000): what it holds beyond is not
    # offered, so a reader sees the same range as with a server ring.
    proc = await _kept(agent, "p", retention=1000, capacity=5000)
    _produce(agent, proc, 1, bytes(range(256)) * 20)  # 5120 bytes: 120 gone from the agent too
    proc.finish(ExecExited(0, "", False, False, 1.0), complete=True)
    assert proc.first_offset(S.STDOUT) == 4120
    events = await _all(follow(agent, proc, 10, 0, 5))  # type: ignore[arg-type]
    assert events[1] == OutputGap(S.STDOUT, 10, 4110)
    assert events[2] == ExecOutput(S.STDOUT, (bytes(range(256)) * 20)[4120:], 4120)
    assert events[3:] == [proc.exited]
    with pytest.raises(OutOfRange):
        await _all(follow(agent, proc, 5121, 0, 5))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        await _all(follow(agent, proc, 0, -1, 5))  # type: ignore[arg-type]
    assert agent.open_streams == 0


async def test_exited_comes_from_the_record_and_quiet_readers_get_keepalives() -> None:
    agent = _Agent()
    proc = await _kept(agent, "p", retention=MiB, capacity=MiB)
    _produce(agent, proc, 1, b"hi")
    reader = follow(agent, proc, 0, 0, 0.01)  # type: ignore[arg-type]
    assert await anext(reader) == ExecStarted("p")
    assert await anext(reader) == ExecOutput(S.STDOUT, b"hi", 0)
    assert await anext(reader) == ExecKeepalive()  # the agent's stream ended; no exit yet
    exited = ExecExited(3, "", False, False, 1.0)
    asyncio.get_running_loop().call_later(0.02, proc.finish, exited)
    rest = [e async for e in reader]
    assert rest[-1] == exited and all(e == ExecKeepalive() for e in rest[:-1])


async def test_an_exited_process_keeps_its_agent_output_until_its_record_is_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(processes, "MAX_PROCESSES_PER_SESSION", 2)
    agent = _Agent()
    pm = ProcessManager(_Executor(agent))  # type: ignore[arg-type]
    procs = pm._records_for("s")
    for name in ("old", "new"):
        procs[name] = await _kept(agent, name, MiB, MiB)
        _produce(agent, procs[name], 1, b"out " + name.encode())
        procs[name].finish(ExecExited(0, "", False, False, 1.0), complete=True)
        await asyncio.sleep(0.001)  # distinct start times
    pm._forget_old_exited(procs)  # the server holds no bytes: nothing goes for bytes
    assert sorted(procs) == ["new", "old"] and not agent.forgotten
    pm._make_room(procs)  # a third process: the oldest exited record goes, in the agent too
    await pm._forgets.settled("s")
    assert sorted(procs) == ["new"] and agent.forgotten == ["old"]
    assert sorted(agent.rings) == ["new"]
    events = await _all(pm.follow(procs["new"], 0, 0, 5))
    assert ExecOutput(S.STDOUT, b"out new", 0) in events
    await pm.close()  # shutdown: the agent forgets what no server will read
    assert agent.forgotten == ["old", "new"] and not agent.rings


def _stdout(events: list[AttachEvent], start: int = 0) -> bytes:
    """The stdout bytes of `events`, checked contiguous from `start` (nothing twice or lost)."""
    out = bytearray()
    for e in events:
        if isinstance(e, ExecOutput) and e.stream is S.STDOUT:
            assert e.offset == start + len(out), (e.offset, start + len(out))
            out += e.data
    return bytes(out)


def _pattern(n: int, seed: int = 0) -> bytes:
    cycle = bytes((seed + i * 7) % 251 for i in range(251))  # no period dividing the pieces'
    return (cycle * (n // 251 + 1))[:n]


async def _take(reader: AsyncIterator[AttachEvent], n: int) -> list[AttachEvent]:
    """The next events until `n` bytes of output came."""
    got: list[AttachEvent] = []
    while sum(len(e.data) for e in got if isinstance(e, ExecOutput)) < n:
        got.append(await anext(reader))
    return got


async def _upto(reader: AsyncIterator[AttachEvent], end: int) -> list[AttachEvent]:
    """The next events until stdout came up to offset `end`."""
    got: list[AttachEvent] = []
    while not got or not (
        isinstance(e := got[-1], ExecOutput)
        and e.stream is S.STDOUT
        and e.offset + len(e.data) >= end
    ):
        got.append(await anext(reader))
    return got


async def test_a_live_follower_reads_the_tail_and_opens_no_agent_stream() -> None:
    agent = _Agent()
    proc = await _kept(agent, "p", retention=8 * MiB, capacity=9 * MiB)
    data = _pattern(3 * MiB)
    reader = follow(agent, proc, 0, 0, 5)  # type: ignore[arg-type]
    assert await anext(reader) == ExecStarted("p")
    events: list[AttachEvent] = []
    for i in range(0, len(data), 64 * 1024):  # the follower keeps up with the writer
        _produce(agent, proc, 1, data[i : i + 64 * 1024])
        _produce(agent, proc, 2, b"e")
        events += await _take(reader, 64 * 1024 + 1)
    proc.finish(ExecExited(0, "", False, False, 1.0), complete=True)
    events += [e async for e in reader]
    assert _stdout(events) == data and events[-1] == proc.exited
    errs = [e for e in events if isinstance(e, ExecOutput) and e.stream is S.STDERR]
    assert b"".join(e.data for e in errs) == b"e" * 48
    assert agent.attaches == 0  # live output crossed the agent's channel once (the server's)


async def test_an_old_offset_reader_switches_from_the_agent_to_the_tail_byte_exact() -> None:
    agent = _Agent()
    proc = await _kept(agent, "p", retention=8 * MiB, capacity=9 * MiB)
    data = _pattern(3 * MiB + 777 + 100_000)
    _produce(agent, proc, 1, data[: 3 * MiB + 777])
    assert proc.tail[S.STDOUT].start == 2 * MiB + 777
    reader = follow(agent, proc, 1000, 0, 5)  # type: ignore[arg-type]
    events = [await anext(reader)]
    assert events == [ExecStarted("p")] and agent.open_streams == 1
    events += await _upto(reader, 2 * MiB + 777)  # from the agent up to the tail's start
    assert agent.open_streams == 1
    events += await _upto(reader, 3 * MiB + 777)
    assert agent.open_streams == 0 and agent.attaches == 1  # on the tail now
    _produce(agent, proc, 1, data[3 * MiB + 777 :])
    events += await _upto(reader, len(data))
    proc.finish(ExecExited(0, "", False, False, 1.0), complete=True)
    events += [e async for e in reader]
    assert _stdout(events, 1000) == data[1000:] and events[-1] == proc.exited
    assert agent.attaches == 1


async def test_a_reader_behind_the_tail_reads_the_agent_then_the_tail_again() -> None:
    agent = _Agent()
    proc = await _kept(agent, "p", retention=8 * MiB, capacity=9 * MiB)
    data = _pattern(6 * MiB, seed=3)
    reader = follow(agent, proc, 0, 0, 5)  # type: ignore[arg-type]
    events = [await anext(reader)]
    _produce(agent, proc, 1, data[:1000])
    events += await _take(reader, 1000)
    assert agent.attaches == 0
    _produce(agent, proc, 1, data[1000 : 4 * MiB])  # the reader is 4 MiB behind: off the tail
    assert proc.tail[S.STDOUT].start > 1000
    events.append(await anext(reader))
    assert agent.open_streams == 1 and agent.attaches == 1  # from the agent's ring
    events += await _upto(reader, 4 * MiB)
    assert agent.open_streams == 0  # within the tail again: the agent's stream closed
    for i in range(4 * MiB, len(data), 64 * 1024):  # it keeps up now: the tail serves it
        _produce(agent, proc, 1, data[i : i + 64 * 1024])
        events += await _upto(reader, i + 64 * 1024)
    proc.finish(ExecExited(0, "", False, False, 1.0), complete=True)
    events += [e async for e in reader]
    assert _stdout(events) == data and agent.attaches == 1


async def test_the_exit_drops_the_tail_and_readers_behind_finish_from_the_agent() -> None:
    agent = _Agent()
    pm = ProcessManager(_Executor(agent))  # type: ignore[arg-type]
    proc = await _kept(agent, "p", retention=8 * MiB, capacity=9 * MiB)
    pm._records_for("s")["p"] = proc
    data = _pattern(2 * MiB, seed=5)
    _produce(agent, proc, 1, data)
    on_tail = follow(agent, proc, MiB + 5, 0, 5)  # type: ignore[arg-type]
    at_end = follow(agent, proc, 2 * MiB, 0, 5)  # type: ignore[arg-type]
    first = [await anext(on_tail), await anext(on_tail)]
    assert await anext(at_end) == ExecStarted("p") and agent.attaches == 0
    assert pm.held_bytes() == MiB
    proc.finish(ExecExited(0, "", False, False, 1.0), complete=True)
    assert proc.tail == {} and pm.held_bytes() == 0  # the record holds no output any more
    assert [e async for e in at_end] == [proc.exited] and agent.attaches == 0
    # A reader on the tail finishes from the (final) tail it holds: no agent stream.
    rest = [e async for e in on_tail]
    assert _stdout(first + rest, MiB + 5) == data[MiB + 5 :] and rest[-1] == proc.exited
    assert agent.attaches == 0
    # A reader that comes after the exit, from an offset the tail held, reads the agent's copy.
    late = [e async for e in follow(agent, proc, MiB + 5, 0, 5)]  # type: ignore[arg-type]
    assert _stdout(late, MiB + 5) == data[MiB + 5 :] and late[-1] == proc.exited
    assert agent.attaches == 1 and agent.open_streams == 0


async def test_live_tails_stay_within_the_sessions_output_budget() -> None:
    """A tail is server memory: running processes' tails (and rings held here) count against
    the session's `process_output_buffer_bytes`, so 64 running writers cannot make the server
    hold 64 x 8 MiB; past the budget a new process gets a smaller tail or none."""
    budget = 20 * MiB
    procs: dict[str, BackgroundProcess] = {}
    tails = []
    for i in range(6):
        proc = BackgroundProcess("s", f"p{i}", _spec())
        tail = room.tail_room(procs, proc, budget)
        proc.keep_in_agent(AgentKept("c", proc.process_id, 16 * MiB), tail)
        procs[proc.process_id] = proc
        tails.append(tail)
    full = room.TAIL_BYTES
    assert tails == [full, full, (budget - 4 * full) // 2, 0, 0, 0]
    assert sum(p.tail_capacity() for p in procs.values()) == budget
    assert all(p.tail_capacity() == 2 * t for p, t in zip(procs.values(), tails, strict=True))


async def test_a_reader_on_the_tail_finishes_from_the_agent_when_the_servers_reader_failed() -> (
    None
):
    """The server's own reader failed mid-way (its stream broke: the record's exit is made up,
    -1, and its end is short of what the process wrote): a reader on the tail must not take
    that end for the end of output. It reads the rest from the agent's copy, whose EXIT is the
    end (before: it got `exited` at the server's end, silently short)."""
    agent = _Agent()
    proc = await _kept(agent, "p", retention=8 * MiB, capacity=9 * MiB)
    data = _pattern(3 * MiB, seed=7)
    reader = follow(agent, proc, 0, 0, 5)  # type: ignore[arg-type]
    assert await anext(reader) == ExecStarted("p")
    _produce(agent, proc, 1, data[: 2 * MiB])
    events = await _upto(reader, 2 * MiB)  # on the tail, at the server's end
    assert proc.tail and agent.open_streams == 0
    attaches = agent.attaches
    agent.rings["p"][1].write(data[2 * MiB :])  # the agent has more; the server never saw it
    proc.finish(ExecExited(-1, "", False, False, 1.0))  # its reader broke: not complete
    events += [e async for e in reader]
    assert _stdout(events) == data and events[-1] == proc.exited
    assert agent.attaches == attaches + 1 and agent.open_streams == 0
    # A late reader from an offset the server saw reads on to the agent's end too.
    late = [e async for e in follow(agent, proc, MiB, 0, 5)]  # type: ignore[arg-type]
    assert _stdout(late, MiB) == data[MiB:] and late[-1] == proc.exited


async def test_an_agent_copy_that_ends_before_the_records_end_is_an_error_not_a_short_read() -> (
    None
):
    """The agent's stream ends (EXIT) before bytes the server's own reader got: a broken copy.
    The reader attaches again from where it is, then fails loudly (AGENT_PROTOCOL_ERROR):
    never `exited` after a short read."""
    agent = _Agent()
    proc = await _kept(agent, "p", retention=8 * MiB, capacity=9 * MiB)
    data = _pattern(2 * MiB, seed=9)
    _produce(agent, proc, 1, data[:MiB])
    proc.append(S.STDOUT, data[MiB:])  # seen by the server, missing in the agent's copy
    proc.finish(ExecExited(0, "", False, False, 1.0), complete=True)
    reader = follow(agent, proc, 0, 0, 5)  # type: ignore[arg-type]
    events: list[AttachEvent] = []
    with pytest.raises(Internal) as caught:
        async for event in reader:
            events.append(event)
    assert caught.value.reason == Reason.AGENT_PROTOCOL_ERROR
    assert _stdout(events) == data[:MiB] and not any(isinstance(e, ExecExited) for e in events)
    assert agent.attaches == 1 + process_agent_output.MAX_SHORT_ENDS
    assert agent.open_streams == 0


async def test_a_reader_of_the_agents_copy_stops_at_the_records_final_end() -> None:
    """A capped or timed-out process: the server cut its output (the record's end is final)
    while the agent's ring holds what it wrote on until the kill landed. A reader of the
    agent's copy gets exactly the record's output, as a reader of the tail does."""
    agent = _Agent()
    proc = await _kept(agent, "p", retention=8 * MiB, capacity=9 * MiB)
    data = _pattern(MiB + 500, seed=11)
    _produce(agent, proc, 1, data[:MiB])
    agent.rings["p"][1].write(data[MiB:])  # written past the cut: not output
    proc.finish(ExecExited(137, "SIGKILL", False, True, 1.0), complete=True)
    events = [e async for e in follow(agent, proc, 10, 0, 5)]  # type: ignore[arg-type]
    assert _stdout(events, 10) == data[10:MiB] and events[-1] == proc.exited


async def test_exited_output_the_agent_keeps_is_bounded_by_the_sandboxs_memory() -> None:
    """Each exited record keeps its output in the agent's ring, in the sandbox's memory, until
    the record goes: the oldest go past a quarter of the sandbox's memory (64 MiB at most), or a
    session's 16th 16 MB writer in a 256 MiB sandbox got its agent OOM-killed (the sandbox
    with it). The newest exited record, and one being read, stay."""
    agent = _Agent()
    pm = ProcessManager(_Executor(agent))  # type: ignore[arg-type]
    procs = pm._records_for("s")
    for i in range(6):
        proc = procs[f"p{i}"] = await _kept(agent, f"p{i}", 16 * MiB, 17 * MiB)
        _produce(agent, proc, 1, b"x" * (15 * MiB))
        proc.finish(ExecExited(0, "", False, False, 1.0), complete=True)
        await asyncio.sleep(0.001)  # distinct start times
    budget = memory.agent_ring_budget(256 * MiB, 64 * MiB)
    assert budget == 128 * MiB and room.agent_exited_limit(budget) == 64 * MiB
    assert room.agent_exited_limit(memory.agent_ring_budget(64 * MiB, 16 * MiB)) == 16 * MiB
    reader = pm.follow(procs["p0"], 0, 0, 5)  # p0 is being read: it stays
    assert await anext(reader) == ExecStarted("p0")
    pm._forget_old_exited(procs, budget)
    await pm._forgets.settled("s")
    assert sorted(procs) == ["p0", "p3", "p4", "p5"] and agent.forgotten == ["p1", "p2"]
    await reader.aclose()
    pm._forget_old_exited(procs, 64 * MiB)  # 32 MiB, and p0 is read no more: it goes first
    await pm._forgets.settled("s")
    assert sorted(procs) == ["p4", "p5"] and agent.forgotten == ["p1", "p2", "p0", "p3"]
    pm._forget_old_exited(procs, 8 * MiB)  # a small sandbox: only the newest stays
    await pm._forgets.settled("s")
    assert sorted(procs) == ["p5"]


def test_the_agents_budget_leaves_room_for_the_workspace_and_the_commands() -> None:
    """The agent's budget is half the sandbox's memory under runc, a quarter under gVisor
    (whose Sentry shares the cgroup, and whose sandbox ends whole when it is full), and never
    so much that the workspace's tmpfs, full, and the agent's rings leave the commands less
    than a quarter: with 128 MiB and a 64 MiB workspace half was 64 MiB, and the rings plus the
    workspace filled the sandbox with nothing but the agent left to kill."""
    assert memory.agent_ring_budget(256 * MiB, 64 * MiB) == 128 * MiB
    assert memory.agent_ring_budget(256 * MiB, 64 * MiB, gvisor=True) == 64 * MiB
    assert memory.agent_ring_budget(128 * MiB, 64 * MiB) == 32 * MiB
    assert memory.agent_ring_budget(64 * MiB, 64 * MiB) == memory.AGENT_MIN_BUDGET
    assert memory.agent_ring_budget(0) == 0  # no limit known: the agent's own default
    # HELLO's, from the container's own HostConfig (what docker_profile writes)
    host = {"Memory": 128 * MiB, "Tmpfs": {"/workspace": f"rw,nosuid,size={64 * MiB},mode=1777"}}
    assert memory.budget_of_container(host) == 32 * MiB
    assert memory.budget_of_container({**host, "Memory": 256 * MiB, "Runtime": "runsc"}) == 64 * MiB
    assert memory.budget_of_container({"Memory": 0}) == 0
