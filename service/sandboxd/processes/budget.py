"""Which process records make room for another (processes/manager.py): pure choices, no side
effects; the ProcessManager drops what they name (and the agent's copy of the output with it).

Records are bounded by count per session; output rings held in the server's memory (Exec, Run
and Interact tails, background processes of sandboxes without the agent, and the live tails of
running processes the agent keeps) also by bytes. An agent's rings are the sandbox's memory:
its exited ones are bounded per session too (a share of the sandbox's memory).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from sandboxd.agent.memory import agent_ring_budget
from sandboxd.errors import ResourceExhausted
from sandboxd.isolation import Isolation
from sandboxd.models import SessionSpec
from sandboxd.processes.record import TAIL_BYTES, BackgroundProcess, HeldTally
from sandboxd.reasons import Reason

Procs = dict[str, BackgroundProcess]
# A session's records as its read-only lookups see them (Records, or NO_RECORDS).
Seen = Mapping[str, BackgroundProcess]


class Records(Procs):
    """One session's records by process id, with the tally of the output its exited records
    hold here (`past_exited_budget`): a record put in counts from then on (what it holds now
    if it has exited already), one deleted takes its count with it."""

    def __init__(self) -> None:
        super().__init__()
        self.tally = HeldTally()

    def __setitem__(self, key: str, proc: BackgroundProcess) -> None:
        if (old := self.get(key)) is not None:
            self._untally(old)
        super().__setitem__(key, proc)
        proc.tally, proc.tallied = self.tally, 0
        if proc.exited is not None and proc.agent is None:
            proc.tallied = proc.retained_bytes()
            self.tally.bytes += proc.tallied

    def __delitem__(self, key: str) -> None:
        self._untally(self[key])
        super().__delitem__(key)

    def _untally(self, proc: BackgroundProcess) -> None:
        self.tally.bytes -= proc.tallied
        proc.tally, proc.tallied = None, 0


# What a lookup of a session without records sees: one shared, read-only, so a lookup builds
# nothing and cannot put a record where no session holds it.
NO_RECORDS: Seen = MappingProxyType({})


# Output the sandbox's agent keeps for exited background processes, per session: at most this,
# and at most half the agent's budget (the rest is its running processes').
AGENT_EXITED_OUTPUT_BYTES = 64 * 1024 * 1024


def session_agent_budget(spec: SessionSpec) -> int:
    """The agent's budget in a session's sandbox."""
    limits = spec.limits
    gvisor = spec.isolation is Isolation.GVISOR
    return agent_ring_budget(
        limits.memory_bytes, spec.memory_workspace_bytes, gvisor=gvisor, pids=limits.pids
    )


def agent_exited_limit(budget: int) -> int:
    """What an agent with `budget` keeps for exited processes (`past_agent_budget`)."""
    return min(AGENT_EXITED_OUTPUT_BYTES, budget // 2)


def held_exited(procs: Seen) -> list[BackgroundProcess]:
    """Exited records whose output is held here (not by an agent), oldest first."""
    held = (p for p in procs.values() if p.exited and p.agent is None)
    return sorted(held, key=lambda p: p.started_at)


def past_exited_budget(procs: Records, limit: int) -> list[BackgroundProcess]:
    """Exit records keep their output for late readers, up to `limit` bytes in all held here:
    the oldest beyond it go. Asked after every command, and nearly always under the limit: the
    session's tally answers that without a pass over its records; only above the limit are
    they totalled (which sets the tally right) and sorted."""
    if procs.tally.bytes <= limit:
        return []
    total = 0
    for p in procs.values():
        held = p.retained_bytes() if p.exited is not None and p.agent is None else 0
        if p.tally is not None:
            p.tallied = held
        total += held
    procs.tally.bytes = total
    if total <= limit:
        return []
    return _oldest_past(held_exited(procs), total, limit, BackgroundProcess.retained_bytes)


def past_agent_budget(procs: Procs, limit: int) -> list[BackgroundProcess]:
    """The agent keeps an exited process's output in the sandbox's memory until its record
    goes: up to `limit` bytes in all per session, the oldest beyond it go (and the agent frees
    their rings). Unbounded, a session's exited rings took the memory its commands and its
    agent need: the 16th 16 MB writer in a 256 MiB sandbox got the agent OOM-killed and the
    sandbox with it. The newest exited record and records being read stay."""
    exited = sorted(
        (p for p in procs.values() if p.exited and p.agent is not None),
        key=lambda p: p.started_at,
    )
    candidates = [p for p in exited[:-1] if p.followers == 0]
    total = sum(p.agent_bytes() for p in exited)
    return _oldest_past(candidates, total, limit, BackgroundProcess.agent_bytes)


def _oldest_past(
    candidates: list[BackgroundProcess],
    total: int,
    limit: int,
    size: Callable[[BackgroundProcess], int],
) -> list[BackgroundProcess]:
    """The first of `candidates` (oldest first) to drop to bring `total` within `limit`."""
    drop = []
    for old in candidates:
        if total <= limit:
            break
        total -= size(old)
        drop.append(old)
    return drop


def _ring_reserve(proc: BackgroundProcess) -> int:
    """What a process whose rings are held here counts against the budget: two rings of its
    buffer size while it runs, what it still keeps once exited."""
    return proc.retained_bytes() if proc.exited else 2 * proc.options.buffer_bytes


def for_buffers(procs: Procs, buffer_bytes: int, budget: int) -> list[BackgroundProcess]:
    """Room in the session's `budget` for two rings of `buffer_bytes` held here: the old exit
    records to drop for it; if running processes hold it all, the start is refused."""
    need = 2 * buffer_bytes
    reserved = sum(_ring_reserve(p) for p in procs.values() if p.agent is None)
    drop = []
    for old in held_exited(procs):
        if reserved + need <= budget:
            break
        reserved -= old.retained_bytes()
        drop.append(old)
    if reserved + need > budget:
        raise ResourceExhausted(
            f"this session's background processes already reserve {reserved} bytes of "
            f"output buffers; {need} more (two streams of max_output_bytes) would pass the "
            f"budget of {budget} (process_output_buffer_bytes): end a process or lower "
            "max_output_bytes",
            reason=Reason.OUTPUT_BUFFER_BUDGET,
            metadata={"limit": str(budget)},
        )
    return drop


def tail_room(procs: Seen, new: BackgroundProcess, budget: int) -> int:
    """Bytes per stream a new live tail may have within the session's `budget` for output held
    here (rings of processes without the agent, and the tails of running ones with it): a
    tail is an optimisation, so a session at its budget gets a smaller one or none (its
    followers then read the agent) rather than a refusal."""
    held = sum(
        _ring_reserve(p) if p.agent is None else p.tail_capacity()
        for p in procs.values()
        if p is not new
    )
    return max(0, min(TAIL_BYTES, (budget - held) // 2))


def oldest_exited(procs: Procs) -> BackgroundProcess | None:
    exited = [p for p in procs.values() if p.exited is not None]
    return min(exited, key=lambda p: p.started_at) if exited else None


def for_one_more(procs: Procs, limit: int) -> BackgroundProcess | None:
    """The record to drop for one more process (the oldest exited) at `limit` records; None
    below it. Refused when all of them run."""
    if len(procs) < limit:
        return None
    oldest = oldest_exited(procs)
    if oldest is None:
        raise ResourceExhausted(
            f"this session already runs {limit} background processes",
            reason=Reason.TOO_MANY_PROCESSES,
            metadata={"limit": str(limit)},
        )
    return oldest
