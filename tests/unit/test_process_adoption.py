"""The pure parts of taking back background processes after a restart (processes/adoption.py):
the detach id, and a spec read back from the `sbx run` supervisor's command line."""

from __future__ import annotations

from sandboxd.processes.adoption import (
    UNKNOWN_TIMEOUT_S,
    detach_id,
    parse_detach_id,
    spec_from_cmdline,
)


def test_detach_ids_round_trip_and_foreign_ones_are_ignored() -> None:
    assert detach_id("bg-1", "bg-1") == "bg-1"
    assert parse_detach_id("bg-1") == ("bg-1", "bg-1")
    for foreign in ("", "Upper", "a/b", "x:y", "-lead", "a" * 64):
        assert parse_detach_id(foreign) is None


def test_a_spec_from_the_supervisors_command_line() -> None:
    cmdline = b"\0".join(
        [
            b"/.sandboxd/sbx",
            b"run",
            b"--id",
            b"p-1",
            b"--timeout-ms",
            b"67000",
            b"--cwd",
            b"/workspace/sub",
            b"--",
            b"sh",
            b"-c",
            b"echo a -- b",
            b"",
        ]
    )
    spec = spec_from_cmdline(cmdline, 4096)
    assert spec.argv == ["sh", "-c", "echo a -- b"]
    assert (
        spec.cwd == "/workspace/sub" and spec.timeout_s == 65.0
    )  # the backstop is 2 s past the server's timeout
    assert spec.max_output_bytes == 4096 and spec.env == {} and spec.stdin == b""


def test_an_unreadable_command_line_gives_an_empty_spec() -> None:
    for junk in (b"", b"garbage", b"/.sandboxd/sbx\0run\0--timeout-ms\0x\0--\0"):
        spec = spec_from_cmdline(junk, 1)
        assert spec.timeout_s in (UNKNOWN_TIMEOUT_S,) and spec.cwd == "/workspace"
    assert spec_from_cmdline(b"garbage", 1).argv == []


def test_a_range_lost_on_the_way_is_a_gap_in_the_servers_ring() -> None:
    from sandboxd.output_ring import OutputBuffer

    buf = OutputBuffer(16)
    buf.append(b"abcdef", 1, merge=False)
    buf.skip(100)
    assert (buf.start, buf.end) == (106, 106)
    assert buf.read(106) is None  # nothing held: a reader at 0..105 is told of a gap
    buf.append(b"xyz", 2, merge=True)
    assert buf.read(106) == (2, b"xyz") and buf.end == 109


def test_the_agents_clock_of_a_kept_process() -> None:
    from sandboxd.processes.adoption import KeptClock, kept_clock

    assert kept_clock({"age_ms": 3000, "timeout_ms": 10000}) == KeptClock(3.0, None, 10.0)
    assert kept_clock({"age_ms": True, "ran_ms": -1, "timeout_ms": "x"}) == KeptClock()
    assert KeptClock(3.0).started_monotonic(100.0) == 97.0
    assert KeptClock().started_monotonic(100.0) is None


def test_a_running_process_keeps_its_timeout_and_an_ended_one_has_none() -> None:
    from sandboxd.models import ExecSpec
    from sandboxd.processes.adoption import KeptClock, adopted_spec

    spec = ExecSpec(["sleep", "9"], "/workspace", {}, b"", 12.0, 1)
    assert adopted_spec(spec, KeptClock(3.0, None, 10.0), running=True).timeout_s == 10.0
    assert adopted_spec(spec, KeptClock(3.0), running=True).timeout_s == 12.0
    assert (
        adopted_spec(spec, KeptClock(3.0, 1.0, 10.0), running=False).timeout_s == UNKNOWN_TIMEOUT_S
    )


def test_a_sigkill_past_the_deadline_while_no_server_was_there_is_a_timeout() -> None:
    from sandboxd.models import ExecExited
    from sandboxd.processes.adoption import KeptClock, adopted_exit

    killed = ExecExited(137, "", False, False, 0.01)
    got = adopted_exit(killed, KeptClock(20.0, 12.0, 10.0), None)
    assert (got.signal, got.timed_out, got.duration_s) == ("SIGKILL", True, 12.0)
    early = adopted_exit(killed, KeptClock(20.0, 4.0, 10.0), None)  # killed before it: not ours
    assert (early.signal, early.timed_out, early.duration_s) == ("", False, 4.0)
    done = adopted_exit(ExecExited(0, "", False, False, 0.01), KeptClock(20.0, 2.0, 10.0), None)
    assert (done.exit_code, done.timed_out, done.duration_s) == (0, False, 2.0)
    live = ExecExited(137, "SIGKILL", True, False, 10.0)  # followed live: as the server saw it
    assert adopted_exit(live, KeptClock(5.0, None, 10.0), None) == live


async def test_calls_wait_for_their_sessions_adoption_and_never_hang() -> None:
    import asyncio

    from sandboxd.processes.adoption import AdoptionGate

    gate = AdoptionGate()
    assert not gate.waiting("s-1")  # a server that adopts nothing: no wait at all
    gate.close()
    assert gate.waiting("s-1") and gate.waiting("s-new")  # not listed yet: every session
    waiter = asyncio.create_task(gate.wait("s-1", 30))
    gate.expect(["s-1", "s-2"])
    assert not gate.waiting("s-new") and gate.waiting("s-1")
    await asyncio.sleep(0)
    assert not waiter.done()
    gate.done("s-1")
    await asyncio.wait_for(waiter, 1)
    assert gate.waiting("s-2")
    await gate.wait("s-2", 0.01)  # bounded: an agent that never answers only delays
    gate.finish()
    assert not gate.waiting("s-2")
