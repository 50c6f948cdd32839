"""Unit tests of the background-process output buffer and its readers (no engine)."""

from __future__ import annotations

import asyncio

import pytest
from sandboxd import output_ring
from sandboxd.errors import InvalidArgument, OutOfRange
from sandboxd.models import ExecExited, ExecKeepalive, ExecOutput, ExecSpec, ExecStarted
from sandboxd.models import OutputStream as S
from sandboxd.processes import BackgroundProcess, OutputBuffer, OutputGap
from sandboxd.processes import budget as process_room


def _drain(buf: OutputBuffer, offset: int) -> bytes:
    out = bytearray()
    while (got := buf.read(offset)) is not None:
        out += got[1]
        offset += len(got[1])
    return bytes(out)


def test_buffer_keeps_exactly_the_last_capacity_bytes() -> None:
    buf = OutputBuffer(10)
    stream = b""
    for i, piece in enumerate([b"abc", b"defgh", b"ijklmnop", b"q", b"rstuvwxyz0123"]):
        buf.append(piece, i, merge=False)
        stream += piece
        assert buf.end == len(stream)
        assert buf.start == max(0, len(stream) - 10)
        assert _drain(buf, buf.start) == stream[buf.start :]
        # Any offset inside the retained range reads the right bytes.
        for offset in range(buf.start, buf.end + 1):
            assert _drain(buf, offset) == stream[offset:]


def test_merging_and_chunk_bound_keep_memory_small(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = OutputBuffer(1_000_000)
    for i in range(10_000):
        buf.append(b"x", i, merge=True)
    assert len(buf._data) - buf._head == 1  # one chunk, grown in place
    monkeypatch.setattr(output_ring, "MAX_CHUNKS", 100)
    buf = OutputBuffer(1_000_000)
    for i in range(1000):
        buf.append(b"%03d" % (i % 1000), i, merge=False)
    assert len(buf._data) - buf._head <= 100
    assert buf.start == 3 * 900 and _drain(buf, buf.start).endswith(b"999")


def test_read_returns_sequence_numbers_for_ordering() -> None:
    buf = OutputBuffer(100)
    buf.append(b"aa", 1, merge=False)
    buf.append(b"bb", 5, merge=False)
    assert buf.read(0) == (1, b"aa")
    assert buf.read(1) == (1, b"a")
    assert buf.read(2) == (5, b"bb")
    assert buf.read(4) is None


def _spec(cap: int) -> ExecSpec:
    return ExecSpec(["x"], "/workspace", {}, b"", 10.0, cap)


async def _collect(agen: object, n: int) -> list[object]:
    out = []
    async for event in agen:  # type: ignore[attr-defined]
        out.append(event)
        if len(out) == n:
            break
    return out


async def test_follow_replays_in_order_reports_gaps_and_exit() -> None:
    proc = BackgroundProcess("s", "p", _spec(4))
    proc.append(S.STDOUT, b"12")
    proc.append(S.STDERR, b"e1")
    proc.append(S.STDOUT, b"3456")  # stdout keeps "3456": bytes 0-1 are gone
    exited = ExecExited(0, "", False, False, 1.0)
    proc.finish(exited)
    events = [e async for e in proc.follow(0, 0, 1.0)]
    assert events == [
        ExecStarted("p"),
        OutputGap(S.STDOUT, 0, 2),
        ExecOutput(S.STDERR, b"e1", 0),
        ExecOutput(S.STDOUT, b"3456", 2),
        exited,
    ]


async def test_follow_checks_offsets() -> None:
    proc = BackgroundProcess("s", "p", _spec(10))
    proc.append(S.STDOUT, b"abc")
    with pytest.raises(OutOfRange) as e1:
        await _collect(proc.follow(4, 0, 1.0), 1)
    assert e1.value.reason == "OFFSET_OUT_OF_RANGE"
    with pytest.raises(InvalidArgument) as e2:
        await _collect(proc.follow(0, -1, 1.0), 1)
    assert e2.value.reason == "INVALID_OFFSET"


async def test_a_reader_that_stops_reading_sees_a_gap_later() -> None:
    proc = BackgroundProcess("s", "p", _spec(8))
    reader = proc.follow(0, 0, 5.0)
    assert await reader.__anext__() == ExecStarted("p")
    proc.append(S.STDOUT, b"abcd")
    assert await reader.__anext__() == ExecOutput(S.STDOUT, b"abcd", 0)
    # The reader is suspended (a slow client); the process keeps writing, nothing waits.
    for chunk in (b"efgh", b"ijkl", b"mnop"):
        proc.append(S.STDOUT, chunk)
    proc.finish(ExecExited(0, "", False, False, 1.0))
    rest = [e async for e in reader]
    assert rest[0] == OutputGap(S.STDOUT, 4, 4)
    assert rest[1] == ExecOutput(S.STDOUT, b"ijklmnop", 8)  # merged writes
    assert isinstance(rest[-1], ExecExited)


async def test_follow_sends_keepalives_and_wakes_on_output() -> None:
    proc = BackgroundProcess("s", "p", _spec(8))
    reader = proc.follow(0, 0, 0.05)
    assert await reader.__anext__() == ExecStarted("p")
    assert await reader.__anext__() == ExecKeepalive()
    asyncio.get_running_loop().call_later(0.01, proc.append, S.STDERR, b"x")
    assert await asyncio.wait_for(reader.__anext__(), 1) == ExecOutput(S.STDERR, b"x", 0)
    await reader.aclose()


async def test_exit_records_are_forgotten_oldest_first_past_the_output_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    procs = process_room.Records()
    for name in ("old", "mid", "new", "running"):
        proc = BackgroundProcess("s", name, _spec(100))
        proc.append(S.STDOUT, b"12345")
        if name != "running":
            proc.finish(ExecExited(0, "", False, False, 1.0))
        procs[name] = proc
        await asyncio.sleep(0.001)  # distinct start times
    for old in process_room.past_exited_budget(procs, 10):
        del procs[old.process_id]
    assert sorted(procs) == ["mid", "new", "running"]


def _exited(name: str, data: bytes) -> BackgroundProcess:
    proc = BackgroundProcess("s", name, _spec(100))
    proc.append(S.STDOUT, data)
    proc.finish(ExecExited(0, "", False, False, 1.0))
    return proc


async def test_a_sessions_records_tally_the_output_their_exited_records_hold() -> None:
    procs = process_room.Records()
    running = BackgroundProcess("s", "running", _spec(100))
    procs["running"] = running
    running.append(S.STDOUT, b"123")
    assert procs.tally.bytes == 0  # a running record's rings are not exit records' output
    running.finish(ExecExited(0, "", False, False, 1.0))
    assert procs.tally.bytes == 3  # counted as it exits
    procs["late"] = _exited("late", b"12345")  # put in after its exit: counted then
    assert procs.tally.bytes == 8
    running.append(S.STDERR, b"xy")  # output after the exit
    assert procs.tally.bytes == 10
    del procs["running"]
    assert procs.tally.bytes == 5
    procs["late"] = _exited("late", b"1")  # a record replaced takes its count with it
    assert procs.tally.bytes == 1


async def test_the_budget_past_the_tally_drops_the_oldest_and_sets_the_tally_right() -> None:
    procs = process_room.Records()
    for name in ("old", "mid", "new"):
        procs[name] = _exited(name, b"12345")
        await asyncio.sleep(0.001)  # distinct start times
    assert process_room.past_exited_budget(procs, 15) == []
    procs.tally.bytes += 100  # counted high (a ring that dropped old bytes, say)
    assert process_room.past_exited_budget(procs, 15) == []  # the pass finds room
    assert procs.tally.bytes == 15
    for old in process_room.past_exited_budget(procs, 10):
        del procs[old.process_id]
    assert sorted(procs) == ["mid", "new"] and procs.tally.bytes == 10
