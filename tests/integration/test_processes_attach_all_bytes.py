"""AttachProcess from offset 0 of a fast 16 MB writer gets every byte over a real server, the
agent keeping the output: what `make bench`'s attach_process_throughput does, with
the content checked (numbered lines, in order, each offset where the last output ended), the
exit checked (code 0: the process wrote it all), and readers at different speeds at once, so
some move between the server's live tail and the agent's ring while others stay on the tail.
A reader that truly fell off the agent's ring would get a `gap`; none may here (the ring holds
it all), and never a short read."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from conftest import SessionFactory, Stubs, first_difference, run
from google.protobuf import duration_pb2
from sandboxd.v1 import common_pb2, process_pb2

P = process_pb2
MiB = 1024 * 1024
COUNT = 2_000_000  # "%07d\n": 16,000,000 bytes, as the bench writes
WANT = b"".join(b"%07d\n" % i for i in range(COUNT))


def _start_writer(stubs: Stubs, sid: str) -> str:
    """The 16 MB writer of numbered lines, as a background process."""
    return stubs.processes.StartProcess(
        P.StartProcessRequest(
            session_id=sid,
            argv=["seq", "-w", "0", str(COUNT - 1)],
            max_output_bytes=16 * MiB,
            timeout=duration_pb2.Duration(seconds=120),
        )
    ).process.process_id


def _read(stubs: Stubs, sid: str, pid: str, pause_s: float) -> tuple[bytes, list[str], int]:
    """stdout (checked contiguous from 0), anything unexpected, the exit code (-999: none)."""
    out = bytearray()
    odd: list[str] = []
    code = -999
    request = P.AttachProcessRequest(session_id=sid, process_id=pid)
    for event in stubs.processes.AttachProcess(request, timeout=180):
        if code != -999:
            odd.append(f"an event after the exit: {event}")
        if event.HasField("output"):
            o = event.output
            if o.stream != P.OUTPUT_STREAM_STDOUT:
                odd.append(f"stderr output {o.data[:80]!r}")
            elif o.offset != len(out):
                odd.append(f"output at {o.offset} after {len(out)} bytes")
            out += o.data
        elif event.HasField("gap"):
            odd.append(f"gap {event.gap}")
        elif event.HasField("exited"):
            code = event.exited.exit_code
        if pause_s:
            time.sleep(pause_s)
    return bytes(out), odd, code


def test_attach_from_zero_gets_every_byte_of_a_fast_writer(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session(limits=common_pb2.ResourceLimits(output_bytes=16 * MiB)).session_id
    problems = []
    with ThreadPoolExecutor(4) as pool:
        for round_ in range(6):
            pid = _start_writer(stubs, sid)
            # As fast as the client goes (twice), a little slower, and slow: the slow ones
            # fall behind the live tail and read the agent's ring.
            readers = [pool.submit(_read, stubs, sid, pid, p) for p in (0, 0, 0.0005, 0.003)]
            for i, reader in enumerate(readers):
                out, odd, code = reader.result()
                if out != WANT or odd or code != 0:
                    first = first_difference(out, WANT)
                    problems.append(
                        f"round {round_} reader {i}: {len(out)} of {len(WANT)} bytes, first "
                        f"difference at {first}, exit {code}, {odd[:3]}"
                    )
    assert not problems, "\n".join(problems)


def test_many_writers_in_one_session_do_not_fill_the_sandbox_with_kept_output(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    """The full bench's pattern: 20 of its 33 writers of 16 MB in one session of the default
    256 MiB, each read whole. The agent keeps an exited process's output in the sandbox's
    memory until its record goes; unbounded, the 16th writer's output got the agent OOM-killed
    and the sandbox with it (before the fix in the live tail, its reader got `exited` at about
    6.8 MB, silently). Old exited records' output now goes past a quarter of the sandbox's
    memory."""
    sid = new_session(limits=common_pb2.ResourceLimits(output_bytes=16 * MiB)).session_id
    problems = []
    for round_ in range(20):
        pid = _start_writer(stubs, sid)
        out, odd, code = _read(stubs, sid, pid, 0)
        if out != WANT or odd or code != 0:
            problems.append(f"round {round_}: {len(out)} bytes, exit {code}, {odd[:3]}")
    assert not problems, "\n".join(problems)
    listed = stubs.processes.ListProcesses(P.ListProcessesRequest(session_id=sid)).processes
    assert 1 <= len(listed) <= 5, len(listed)  # 64 MiB of 16 MB outputs: the newest four


def test_running_writers_do_not_fill_the_sandbox_with_their_rings(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    """20 processes that write 16 MB each and stay alive, in one session of the default
    256 MiB. Their rings in the agent held 320 MB and the agent was OOM-killed with the
    sandbox ("container … is not running"). Past half the sandbox's memory a ring still
    filling now wraps where it is: the session works on, and a reader from offset 0 of any of
    them gets a gap, then the newest output to the end, never a short read. (More pids than
    the default 64, within the default largest: each process is four with its supervisor.)"""
    limits = common_pb2.ResourceLimits(output_bytes=16 * MiB, pids=256)
    sid = new_session(limits=limits).session_id
    pids = [
        stubs.processes.StartProcess(
            P.StartProcessRequest(
                session_id=sid,
                argv=["sh", "-c", f"seq -w 0 {COUNT - 1}; exec sleep 600"],
                max_output_bytes=16 * MiB,
                timeout=duration_pb2.Duration(seconds=300),
            )
        ).process.process_id
        for _ in range(20)
    ]
    deadline = time.monotonic() + 180
    while True:
        listed = stubs.processes.ListProcesses(P.ListProcessesRequest(session_id=sid)).processes
        if all(p.stdout_bytes == len(WANT) for p in listed if p.process_id in pids):
            break
        assert time.monotonic() < deadline, [(p.process_id, p.stdout_bytes) for p in listed]
        time.sleep(0.5)
    assert all(p.state == P.PROCESS_STATE_RUNNING for p in listed if p.process_id in pids)
    assert run(stubs, sid, "true").exit_code == 0  # the sandbox and its agent are whole
    for pid in (pids[0], pids[-1]):
        stubs.processes.SignalProcess(
            P.SignalProcessRequest(session_id=sid, process_id=pid, signal="SIGKILL")
        )
        out, at, code = bytearray(), 0, -999
        request = P.AttachProcessRequest(session_id=sid, process_id=pid)
        for event in stubs.processes.AttachProcess(request, timeout=120):
            if event.HasField("gap"):
                assert not out, "a gap after output"
                at = event.gap.offset + event.gap.length
            elif event.HasField("output") and event.output.stream == P.OUTPUT_STREAM_STDOUT:
                assert event.output.offset == at + len(out)
                out += event.output.data
            elif event.HasField("exited"):
                code = event.exited.exit_code
        assert code == 137 and bytes(out) == WANT[at:], (pid, at, len(out), code)
