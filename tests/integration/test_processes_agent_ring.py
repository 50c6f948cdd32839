"""Background processes' output stays in the sandbox's agent, not in the server:
processes that write far more than their rings leave the server's memory where it was, while
AttachProcess from 0 still replays what the agent's ring holds, with the rest a `gap`."""

from __future__ import annotations

import secrets

import pytest
from conftest import make_stubs, remove_owned_containers, rss_bytes, start_server, wait_until
from google.protobuf import duration_pb2
from sandboxd.v1 import common_pb2, process_pb2, session_pb2

P = process_pb2
MiB = 1024 * 1024
RING = 16 * MiB  # the largest max_output_bytes (limits), the ring of each stream
WRITTEN = 64 * MiB


def test_background_output_is_held_by_the_agent_not_the_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    owner = "testsd" + secrets.token_hex(3)
    srv = start_server(tmp_path_factory.mktemp("sd"), owner)
    stubs = make_stubs(srv.address)
    try:
        sid = stubs.sessions.CreateSession(
            session_pb2.CreateSessionRequest(
                shell=common_pb2.ShellPolicy(allow_all=True),
                limits=common_pb2.ResourceLimits(memory_bytes=512 * MiB, output_bytes=RING),
            )
        ).session.session_id
        # Warm up the paths the processes take (a first process, a first attach), then measure.
        warm = stubs.processes.StartProcess(
            P.StartProcessRequest(session_id=sid, argv=["echo", "warm"])
        ).process
        list(
            stubs.processes.AttachProcess(
                P.AttachProcessRequest(session_id=sid, process_id=warm.process_id), timeout=60
            )
        )
        before = rss_bytes(srv.proc.pid)
        names = [f"loud-{i}" for i in range(3)]  # 16 MiB rings: 48 MiB in a server ring
        for name in names:
            stubs.processes.StartProcess(
                P.StartProcessRequest(
                    session_id=sid,
                    process_id=name,
                    argv=["sh", "-c", f"yes 0123456789abcdef | head -c {WRITTEN}; echo end >&2"],
                    max_output_bytes=RING,
                    timeout=duration_pb2.Duration(seconds=120),
                )
            )

        def exited() -> bool:
            procs = stubs.processes.ListProcesses(P.ListProcessesRequest(session_id=sid))
            return all(
                p.state == P.PROCESS_STATE_EXITED for p in procs.processes if p.process_id in names
            )

        assert wait_until(exited, timeout=120, interval=0.2)
        procs = {
            p.process_id: p
            for p in stubs.processes.ListProcesses(P.ListProcessesRequest(session_id=sid)).processes
        }
        for name in names:
            assert procs[name].exited.exit_code == 0
            assert procs[name].stdout_bytes == WRITTEN
            assert procs[name].stdout_first_offset == WRITTEN - RING
        grown = rss_bytes(srv.proc.pid) - before
        # A server ring per process would hold 3 x 16 MiB of it now (48 MiB and more of RSS).
        assert grown < 32 * MiB, f"server RSS grew by {grown / MiB:.1f} MiB"

        events = list(
            stubs.processes.AttachProcess(
                P.AttachProcessRequest(session_id=sid, process_id="loud-0"), timeout=60
            )
        )
        assert events[0].HasField("started") and events[-1].HasField("exited")
        gaps = [e.gap for e in events if e.HasField("gap")]
        assert [(g.stream, g.offset, g.length) for g in gaps] == [
            (P.OUTPUT_STREAM_STDOUT, 0, WRITTEN - RING)
        ]
        out = b"".join(
            e.output.data
            for e in events
            if e.HasField("output") and e.output.stream == P.OUTPUT_STREAM_STDOUT
        )
        line = b"0123456789abcdef\n"
        assert out == (line * (WRITTEN // len(line) + 1))[WRITTEN - RING : WRITTEN]
        err = b"".join(
            e.output.data
            for e in events
            if e.HasField("output") and e.output.stream == P.OUTPUT_STREAM_STDERR
        )
        assert err == b"end\n"
        # A reader from the middle starts exactly there.
        events = list(
            stubs.processes.AttachProcess(
                P.AttachProcessRequest(
                    session_id=sid, process_id="loud-1", stdout_offset=WRITTEN - 5
                ),
                timeout=60,
            )
        )
        tail = (line * (WRITTEN // len(line) + 1))[WRITTEN - 5 : WRITTEN]
        assert [e.output.data for e in events if e.HasField("output")][0] == tail
    finally:
        stubs.channel.close()
        srv.stop()
        remove_owned_containers(owner)
