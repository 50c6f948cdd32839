"""The process guarantees not already covered in test_exec.py: escapes by double
fork and `env -i`, and many concurrent streams on one session and across sessions."""

from __future__ import annotations

import threading

import pytest
from conftest import SessionFactory, Stubs, run
from google.protobuf import duration_pb2
from sandboxd.v1 import common_pb2, process_pb2

P = process_pb2


def _alive(stubs: Stubs, sid: str, marker: str) -> bool:
    ps = run(stubs, sid, "ps", "-o", "pid,args").stdout.decode()
    return any(marker in line and "ps -o" not in line for line in ps.splitlines())


@pytest.mark.parametrize(
    ("script", "marker"),
    [
        # Double fork: the grandchild is orphaned at once and reparented.
        ("(sh -c 'sleep 801 &' &); echo ok", "sleep 801"),
        ("(setsid sh -c '(sleep 802 &) &' &); echo ok", "sleep 802"),
        # A cleared environment: nothing identifies the command by its variables.
        ("env -i /bin/sh -c 'sleep 803 &'; echo ok", "sleep 803"),
        ("env -i /bin/sh -c 'setsid nohup sleep 804 >/dev/null 2>&1 &'; echo ok", "sleep 804"),
    ],
    ids=["double-fork", "setsid-double-fork", "env-i", "env-i-setsid-nohup"],
)
def test_descendants_do_not_outlive_the_command(
    stubs: Stubs, new_session: SessionFactory, script: str, marker: str
) -> None:
    sid = new_session().session_id
    r = run(stubs, sid, "sh", "-c", script)
    assert r.stdout == b"ok\n" and r.exit_code == 0
    assert not _alive(stubs, sid, marker)


def _exec_collect(stubs: Stubs, sid: str, i: int, results: dict[int, object]) -> None:
    try:
        events = list(
            stubs.processes.Exec(
                P.ExecRequest(
                    session_id=sid,
                    argv=["sh", "-c", f"echo start-{i}; sleep 0.5; echo end-{i} >&2"],
                    timeout=duration_pb2.Duration(seconds=60),
                ),
                timeout=120,
            )
        )
        out = b"".join(e.output.data for e in events if e.output.stream == 1)
        err = b"".join(e.output.data for e in events if e.output.stream == 2)
        results[i] = (out, err, events[-1].exited.exit_code)
    except Exception as exc:  # reported by the assertion below
        results[i] = exc


def _expected(i: int) -> tuple[bytes, bytes, int]:
    return (f"start-{i}\n".encode(), f"end-{i}\n".encode(), 0)


def test_100_concurrent_exec_streams_on_one_session(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    sid = new_session(limits=common_pb2.ResourceLimits(pids=512)).session_id
    results: dict[int, object] = {}
    threads = [
        threading.Thread(target=_exec_collect, args=(stubs, sid, i, results)) for i in range(100)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wrong = {i: r for i, r in results.items() if r != _expected(i)}
    assert len(results) == 100 and not wrong, wrong


def test_20_sessions_with_streams_at_once(stubs: Stubs, new_session: SessionFactory) -> None:
    sids: list[str] = []
    lock = threading.Lock()

    def create() -> None:
        sid = new_session().session_id
        with lock:
            sids.append(sid)

    creators = [threading.Thread(target=create) for _ in range(20)]
    for t in creators:
        t.start()
    for t in creators:
        t.join()
    assert len(sids) == 20
    results: dict[int, object] = {}
    threads = [
        threading.Thread(target=_exec_collect, args=(stubs, sids[i % 20], i, results))
        for i in range(60)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wrong = {i: r for i, r in results.items() if r != _expected(i)}
    assert len(results) == 60 and not wrong, wrong


def test_truncation_kills_within_a_second(stubs: Stubs, new_session: SessionFactory) -> None:
    sid = new_session().session_id
    r = run(stubs, sid, "sh", "-c", "sleep 901 & yes", max_output_bytes=64 * 1024)
    assert r.truncated and r.signal == "SIGKILL" and len(r.stdout) == 64 * 1024
    assert r.duration.ToNanoseconds() < 1_000_000_000, r.duration
    assert not _alive(stubs, sid, "sleep 901")
    assert not _alive(stubs, sid, "yes")
