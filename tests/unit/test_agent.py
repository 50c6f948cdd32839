"""`sbx agent` over pipes (docs/agent.md), driven by the independent codec tests/agent_wire.py.

Outside a PID namespace the agent is a child subreaper of the test, so commands, orphans and
the channel behave as in a sandbox; PID-1-only protections are the integration test's
(tests/integration/test_agent_container.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_pipes import AgentProcess, Helper, running_agent  # noqa: E402
from agent_wire import (  # noqa: E402
    CLOSE,
    DATA,
    EOF,
    EXIT,
    GOAWAY,
    HELLO,
    OPEN,
    OPEN_OK,
    PING,
    PONG,
    RESET,
    RESIZE,
    SIGNAL,
    SYNC,
    WINDOW,
    Frame,
    data,
    encode,
    encode_json,
    exit_of,
    output,
    window,
)
from conftest import rss_bytes  # noqa: E402

SH = shutil.which("sh") or "/bin/sh"


@pytest.fixture
def agent(agent_helper: Helper, tmp_path: Path) -> Iterator[AgentProcess]:
    """The agent, static and ASan/UBSan (tests/agent_pipes.py): a sanitizer report fails."""
    with running_agent(agent_helper, tmp_path) as a:
        yield a


def run(a: AgentProcess, script: str, **fields: object) -> list[Frame]:
    sid = a.open("exec", argv=[SH, "-c", script], env={"PATH": "/usr/bin:/bin"}, **fields)
    return a.stream_frames(sid)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or going while read
        return False


# ---------------------------------------------------------------- hello, epochs, resync


def test_hello_answers_with_nonce_instance_and_pid(agent: AgentProcess) -> None:
    ok = agent.hello().json()
    assert ok["version"] == 1 and ok["processes"] == [] and ok["egress_port"] == 0
    assert ok["pid"] == agent.proc.pid and len(ok["instance"]) == 32
    again = agent.hello().json()
    assert again["instance"] == ok["instance"] and again["nonce"] != ok["nonce"]


def test_nothing_is_answered_before_a_sync(agent: AgentProcess) -> None:
    agent.send(encode_json(HELLO, 0, {"version": 1, "nonce": "aa"}))
    agent.send(encode(PING, 0, b"12345678"))
    assert agent.quiet(0.3) == []
    assert agent.hello().type == 0x02


def test_resync_after_garbage(agent: AgentProcess) -> None:
    agent.send(os.urandom(5000) + b"\xff\xff\xff\xffSANDBOX")  # a marker's prefix too
    agent.hello()
    # garbage inside an epoch: a length out of range ends it with GOAWAY
    agent.send(struct.pack(">IBI", 70000, DATA, 1) + b"x" * 50)
    frames = agent.read_until(lambda f: f.type == GOAWAY)
    assert frames[-1].json()["error"] == "PROTOCOL"
    agent.send(encode(PING, 0, b"abcdefgh"))
    assert agent.quiet(0.3) == []  # skipping to the next SYNC
    agent.hello()
    agent.send(encode(PING, 0, b"abcdefgh"))
    assert agent.read() == Frame(PONG, 0, b"abcdefgh")


def test_resync_after_a_half_written_frame(agent: AgentProcess) -> None:
    agent.hello()
    sid = agent.open("exec", argv=["/bin/sleep", "30"], env={})
    pid = agent.read().json()["pid"]
    # a server dies in the middle of a frame of 60000 bytes ...
    agent.send(struct.pack(">IBI", 60000, DATA, sid) + b"\0" + b"y" * 100)
    time.sleep(0.3)
    # ... the next one's SYNC + HELLO is not swallowed as the rest of it
    agent.hello()
    agent.send(encode(PING, 0, b"01234567"))
    assert agent.read() == Frame(PONG, 0, b"01234567")
    # and the old epoch's command is ended (SIGHUP)
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_ping_is_answered_and_unknown_control_type_is_a_notice(agent: AgentProcess) -> None:
    agent.hello()
    agent.send(encode(PING, 0, b"pingpong"))
    assert agent.read() == Frame(PONG, 0, b"pingpong")
    agent.send(encode(0x7F, 0, b"??"))
    f = agent.read()
    assert (f.type, f.stream, f.json()["error"]) == (RESET, 0, "PROTOCOL")
    agent.send(encode(PING, 0, b"stillok!"))
    assert agent.read() == Frame(PONG, 0, b"stillok!")


def test_keepalive_ping_then_goaway_and_commands_end(agent: AgentProcess) -> None:
    agent.hello(keepalive_ms=200)
    sid = agent.open("exec", argv=["/bin/sleep", "30"], env={})
    pid = agent.read().json()["pid"]
    frames = agent.read_until(lambda f: f.type == GOAWAY, timeout=5)
    assert any(f.type == PING for f in frames)
    assert frames[-1].json()["error"] == "KEEPALIVE"
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)
    assert sid == 1


def test_bad_hello_version_and_json(agent: AgentProcess) -> None:
    agent.send(SYNC + encode_json(HELLO, 0, {"version": 2, "nonce": "x"}))
    assert agent.read().json()["error"] == "VERSION"
    agent.send(SYNC + encode(HELLO, 0, b'{"version":1,"nonce":'))
    assert agent.read().json()["error"] == "PROTOCOL"
    agent.hello()


# ---------------------------------------------------------------- exec


def test_exec_output_exit_and_exact_env(agent: AgentProcess, tmp_path: Path) -> None:
    agent.hello()
    frames = run(agent, "echo out; echo err >&2; env | sort; pwd; exit 7")
    assert frames[0].type == OPEN_OK and frames[0].json()["pid"] > 0
    out = output(frames).decode()
    assert out.splitlines() == ["out", "PATH=/usr/bin:/bin", "PWD=" + str(tmp_path), str(tmp_path)]
    assert output(frames, 2) == b"err\n"
    assert exit_of(frames) == {"exit_code": 7, "signal": None}


def test_exec_cwd_relative_to_root(agent: AgentProcess, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    agent.hello()
    assert output(run(agent, "pwd", cwd="sub")) == f"{tmp_path}/sub\n".encode()


def test_exec_stdin_and_eof(agent: AgentProcess) -> None:
    agent.hello()
    sid = agent.open("exec", argv=["/bin/cat"], env={}, stdin=True)
    assert agent.read().type == OPEN_OK
    agent.send(data(sid, b"one "))
    agent.send(data(sid, b"two"))
    agent.send(encode(EOF, sid, b"\0"))
    frames = agent.stream_frames(sid)
    assert output(frames) == b"one two" and exit_of(frames)["exit_code"] == 0


def test_exec_large_stdin_is_flow_controlled_and_all_arrives(agent: AgentProcess) -> None:
    agent.hello(window=65536)
    sid = agent.open("exec", argv=["/usr/bin/wc", "-c"], env={}, stdin=True)
    assert agent.read().type == OPEN_OK
    credit, sent, total = 65536, 0, 1_000_000
    while sent < total:
        while credit == 0:
            f = agent.read()
            assert f.type == WINDOW and f.stream == sid, f
            credit += struct.unpack(">I", f.payload)[0]
        n = min(credit, 30000, total - sent)
        agent.send(data(sid, b"z" * n))
        sent += n
        credit -= n
    agent.send(encode(EOF, sid, b"\0"))
    frames = [f for f in agent.stream_frames(sid) if f.type != WINDOW]
    assert output(frames).strip() == b"1000000"


def test_exec_signal_to_the_process_group(agent: AgentProcess) -> None:
    agent.hello()
    sid = agent.open("exec", argv=[SH, "-c", "echo up; sleep 30"], env={})
    assert agent.read().type == OPEN_OK
    assert agent.read().data == b"up\n"
    agent.send(encode(SIGNAL, sid, bytes([signal.SIGTERM])))
    assert exit_of(agent.stream_frames(sid)) == {"exit_code": 128 + 15, "signal": 15}


def test_exec_tty_and_resize(agent: AgentProcess) -> None:
    agent.hello()
    script = "stty size; read line; stty size; echo got:$line"
    sid = agent.open(
        "exec", argv=[SH, "-c", script], env={}, stdin=True, tty={"rows": 30, "cols": 100}
    )
    assert agent.read().type == OPEN_OK
    got = b""
    while b"30 100" not in got:
        got += agent.read().data
    agent.send(encode(RESIZE, sid, struct.pack(">HH", 40, 120)))
    agent.send(data(sid, b"hello\n"))
    frames = agent.stream_frames(sid)
    text = output(frames).replace(b"\r", b"")
    assert b"40 120\n" in text and b"got:hello\n" in text
    assert exit_of(frames)["exit_code"] == 0


def test_exec_tty_eof_is_ctrl_d(agent: AgentProcess) -> None:
    agent.hello()
    sid = agent.open("exec", argv=["/bin/cat"], env={}, stdin=True, tty={"rows": 5, "cols": 5})
    assert agent.read().type == OPEN_OK
    agent.send(encode(EOF, sid, b"\0"))
    assert exit_of(agent.stream_frames(sid))["exit_code"] == 0


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        ({"argv": ["/nonexistent/prog"], "env": {}}, "NOT_FOUND"),
        ({"argv": ["/etc"], "env": {}}, "PERMISSION_DENIED"),
        ({"argv": ["/bin/true"], "env": {}, "cwd": "no/such/dir"}, "CWD"),
        ({"argv": ["true"], "env": {}}, "INVALID"),
        ({"argv": [], "env": {}}, "INVALID"),
        ({"argv": ["/bin/true", 3], "env": {}}, "INVALID"),
        ({"argv": ["/bin/true"], "env": {"A=B": "c"}}, "INVALID"),
        ({"argv": ["/bin/true"], "env": {"A": 1}}, "INVALID"),
        ({"argv": ["/bin/true"], "env": {}, "tty": {"rows": 0, "cols": 1}}, "INVALID"),
        ({"argv": ["/bin/true"], "env": {}, "detach": {"id": ""}}, "INVALID"),
    ],
)
def test_exec_that_cannot_start(
    agent: AgentProcess, request_: dict[str, object], error: str
) -> None:
    agent.hello()
    sid = agent.open("exec", **request_)
    f = agent.read()
    assert (f.type, f.stream, f.json()["error"]) == (RESET, sid, error), f
    agent.send(encode(PING, 0, b"alive..."))
    assert agent.read().type == PONG


def test_reset_of_exec_sends_sighup_then_kill(agent: AgentProcess) -> None:
    agent.hello()
    # ignores SIGHUP: the SIGKILL one second later ends it
    sid = agent.open("exec", argv=[SH, "-c", "trap '' HUP; echo ready; sleep 30"], env={})
    pid = agent.read().json()["pid"]
    assert agent.read().data == b"ready\n"
    agent.send(encode_json(RESET, sid, {"error": "CANCELLED", "message": "client went away"}))
    time.sleep(0.3)
    assert alive(pid)  # SIGHUP ignored; the SIGKILL comes one second after it
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)
    assert agent.quiet(0.2) == []  # nothing more on that stream


# Blocks SIGHUP and spins on a non-blocking stdin (a reader already running sees an EOF at
# once), then writes whether a SIGHUP was pending when the EOF came.
HUP_PROBE = """
import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
os.set_blocking(0, False)
print("ready", flush=True)
while True:
    try:
        if not os.read(0, 4096):
            break
    except BlockingIOError:
        pass
pending = signal.SIGHUP in signal.sigpending()
with open(sys.argv[1], "w") as f:
    f.write("pending" if pending else "not yet")
"""


def test_a_reset_command_is_signalled_before_its_stdin_ends(
    agent: AgentProcess, tmp_path: Path
) -> None:
    """Closing a reset command's stdin is an EOF: a command that took it for the end of its
    input (`sbx write`, which then gives its upload its name) would complete a cancelled call.
    The SIGHUP must be pending before that EOF can be read, every time."""
    agent.hello()
    for i in range(8):
        mark = tmp_path / f"seen-{i}"
        sid = agent.open(
            "exec", argv=[sys.executable, "-c", HUP_PROBE, str(mark)], env={}, stdin=True
        )
        assert agent.read().type == OPEN_OK
        assert agent.read().data == b"ready\n"
        agent.send(encode_json(RESET, sid, {"error": "CANCELLED", "message": "client went away"}))
        deadline = time.monotonic() + 10
        while not mark.exists() or not mark.read_text():
            assert time.monotonic() < deadline, "the probe never saw its stdin end"
            time.sleep(0.01)
        assert mark.read_text() == "pending", i


def test_orphans_of_a_command_are_killed(agent: AgentProcess, tmp_path: Path) -> None:
    agent.hello()
    # the orphan test: the command's parent is killed, its child is reparented to the agent
    frames = run(agent, "sh -c 'sleep 4242 & echo $!; kill -KILL $$'")
    pid = int(output(frames))
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)
    # a double-forked, setsid escapee during a running command dies as well
    sid = agent.open(
        "exec",
        # Still running while the escapee is killed; it ends once the escapee is gone (at most
        # 2 s, as a plain `sleep 2` did) rather than always after the whole 2 s.
        argv=[
            SH,
            "-c",
            "setsid sh -c 'sleep 4343 & echo $!' > esc; "
            "for i in $(seq 40); do sleep 0.05; kill -0 $(cat esc) 2>/dev/null || break; done",
        ],
        env={"PATH": "/usr/bin:/bin"},
    )
    assert agent.read().type == OPEN_OK
    esc_file = tmp_path / "esc"
    deadline = time.monotonic() + 3
    while not (esc_file.exists() and esc_file.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    esc = int(esc_file.read_text())
    deadline = time.monotonic() + 3
    while alive(esc) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(esc)
    assert exit_of(agent.stream_frames(sid))["exit_code"] == 0


# ---------------------------------------------------------------- flow control


def test_streamed_output_is_gathered_into_large_frames(agent: AgentProcess) -> None:
    """A command writing 4 KiB at a time without a pause: its output is read again only after
    a short hold, so it leaves in frames of many writes, not one frame per write; every byte
    arrives, in order."""
    agent.hello()
    writes, size = 256, 4096
    script = f'i=0; while [ $i -lt {writes} ]; do printf "%{size}s" ""; i=$((i+1)); done'
    frames = run(agent, script)
    out = [f for f in frames if f.type == DATA and f.payload[0] == 1]
    assert sum(len(f.payload) - 1 for f in out) == writes * size
    assert exit_of(frames)["exit_code"] == 0
    assert len(out) <= writes // 4, f"{len(out)} frames for {writes} writes"


def test_unrefilled_window_stalls_only_its_own_stream(agent: AgentProcess) -> None:
    agent.hello(window=4096)
    slow = agent.open("exec", argv=["/bin/sh", "-c", "yes slow | head -c 1000000"], env={})
    fast = agent.open("exec", argv=["/bin/sh", "-c", "yes fast | head -c 200000"], env={})
    got_slow = 0
    fast_frames: list[Frame] = []
    deadline = time.monotonic() + 20
    while not (fast_frames and fast_frames[-1].type == EXIT and got_slow >= 4096):
        assert time.monotonic() < deadline
        f = agent.read()
        if f.stream == slow and f.type == DATA:
            got_slow += len(f.data)  # never refilled
        elif f.stream == fast:
            fast_frames.append(f)
            if f.type == DATA:
                agent.send(window(fast, len(f.data)))
    assert len(output(fast_frames)) == 200000
    assert agent.quiet(0.3) == []
    assert got_slow == 4096  # exactly the window, then it waits
    agent.send(window(slow, 1_000_000))
    frames = agent.stream_frames(slow)
    assert got_slow + len(output(frames)) == 1000000


def test_data_beyond_the_window_is_flow_control_error(agent: AgentProcess) -> None:
    agent.hello(window=4096)
    sid = agent.open("exec", argv=["/bin/sleep", "30"], env={}, stdin=True)
    assert agent.read().type == OPEN_OK
    agent.send(data(sid, b"x" * 5000))
    f = agent.read_until(lambda f: f.type == RESET)[-1]
    assert f.stream == sid and f.json()["error"] == "FLOW_CONTROL"


# ---------------------------------------------------------------- bad input


def test_stream_opened_twice(agent: AgentProcess) -> None:
    agent.hello()
    sid = agent.open("exec", argv=["/bin/sleep", "30"], env={})
    pid = agent.read().json()["pid"]
    agent.send(encode_json(OPEN, sid, {"kind": "processes"}))
    f = agent.read()
    assert (f.type, f.stream, f.json()["error"]) == (RESET, sid, "PROTOCOL")
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)
    # a lower id than one already used is "already used" too; an even id is the agent's
    agent.send(encode_json(OPEN, 99, {"kind": "processes"}))
    assert agent.read_until(lambda f: f.type == CLOSE)[-1].stream == 99
    for bad in (97, 100):
        agent.send(encode_json(OPEN, bad, {"kind": "processes"}))
        f = agent.read()
        assert (f.type, f.stream, f.json()["error"]) == (RESET, bad, "PROTOCOL")


def test_data_after_eof_and_frames_on_streams_never_opened(agent: AgentProcess) -> None:
    agent.hello()
    # still running after its stdin ends: the late DATA cannot cross its EXIT
    sid = agent.open("exec", argv=[SH, "-c", "cat; sleep 30"], env={}, stdin=True)
    assert agent.read().type == OPEN_OK
    agent.send(encode(EOF, sid, b"\0"))
    agent.send(data(sid, b"late"))
    frames = agent.read_until(lambda f: f.type in (RESET, EXIT) and f.stream == sid)
    assert frames[-1].type == RESET and frames[-1].json()["error"] == "PROTOCOL"
    # never opened: RESET; already ended (crossed in flight): ignored
    agent.send(data(1001, b"x"))
    f = agent.read()
    assert (f.type, f.stream, f.json()["error"]) == (RESET, 1001, "PROTOCOL")
    agent.send(window(sid, 100))
    # a RESET is never answered with a RESET, on a stream never opened nor on stream 0
    agent.send(encode_json(RESET, 2001, {"error": "PROTOCOL", "message": "?"}))
    agent.send(encode_json(RESET, 0, {"error": "PROTOCOL", "message": "?"}))
    agent.send(encode(PING, 0, b"12345678"))
    assert agent.read().type == PONG


def test_unknown_stream_frame_type_and_bad_sizes(agent: AgentProcess) -> None:
    agent.hello()
    for payload, ftype in ((b"", 0x42), (b"\0\0", WINDOW), (b"", SIGNAL), (b"\5", DATA)):
        sid = agent.open("exec", argv=["/bin/sleep", "30"], env={}, stdin=True)
        assert agent.read().type == OPEN_OK
        agent.send(encode(ftype, sid, payload))
        f = agent.read()
        assert (f.type, f.stream, f.json()["error"]) == (RESET, sid, "PROTOCOL"), f


def test_unknown_open_kind_and_bad_json(agent: AgentProcess) -> None:
    agent.hello()
    sid = agent.open("teleport")
    assert agent.read().json()["error"] == "INVALID"
    agent.send(encode(OPEN, sid + 2, b'{"kind": "exec", "argv": ['))
    f = agent.read()
    assert (f.stream, f.json()["error"]) == (sid + 2, "INVALID")


# ---------------------------------------------------------------- detached processes


def test_detached_survives_new_epoch_and_attach_replays(agent: AgentProcess) -> None:
    agent.hello()
    script = "i=0; while [ $i -lt 5 ]; do echo line$i; i=$((i+1)); done; read x; echo in:$x; exit 3"
    sid = agent.open(
        "exec",
        argv=[SH, "-c", script],
        env={},
        stdin=True,
        detach={"id": "job-1", "buffer": 4096},
    )
    pid = agent.read().json()["pid"]
    want = len(b"".join(b"line%d\n" % i for i in range(5)))
    deadline = time.monotonic() + 10
    while True:  # a new server: the exec stream is gone, the process is not
        (rec,) = agent.hello().json()["processes"]
        if rec["end"]["1"] == want or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert rec["id"] == "job-1" and rec["pid"] == pid and rec["running"] is True
    assert rec["end"]["1"] == want
    assert alive(pid)
    att = agent.open("attach", id="job-1", offsets={"1": 6, "2": 0})
    f = agent.read()
    assert f.type == OPEN_OK and f.json()["start"] == {"1": 0, "2": 0}
    agent.send(data(att, b"hi\n"))
    frames = agent.stream_frames(att)
    assert output(frames) == b"line1\nline2\nline3\nline4\nin:hi\n"
    assert exit_of(frames) == {"exit_code": 3, "signal": None}
    lst = agent.open("processes")
    frames = agent.stream_frames(lst)
    (rec,) = frames[0].json()["processes"]
    assert rec["running"] is False and rec["exit_code"] == 3
    # attach after the end replays from the start of the ring and ends with EXIT
    again = agent.stream_frames(agent.open("attach", id="job-1", offsets={"1": 0, "2": 0}))
    assert output(again).startswith(b"line0\n") and exit_of(again)["exit_code"] == 3
    fg = agent.open("forget", id="job-1")
    assert [f.type for f in agent.stream_frames(fg)] == [OPEN_OK, CLOSE]
    assert agent.hello().json()["processes"] == []
    assert sid == 1


def test_detached_ring_keeps_the_newest_bytes(agent: AgentProcess) -> None:
    agent.hello()
    agent.open(
        "exec",
        argv=[SH, "-c", "head -c 10000 /dev/zero | tr '\\0' a; printf END"],
        env={},
        detach={"id": "big", "buffer": 1024},
    )
    assert agent.read().type == OPEN_OK
    deadline = time.monotonic() + 10
    while agent.hello().json()["processes"][0]["end"]["1"] < 10003:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    att = agent.open("attach", id="big", offsets={"1": 0, "2": 0})
    f = agent.read()
    assert f.json()["start"]["1"] == 10003 - 1024 and f.json()["end"]["1"] == 10003
    frames = agent.stream_frames(att)
    assert output(frames) == b"a" * 1021 + b"END"


def test_a_reader_overrun_by_the_ring_is_reset_and_the_agent_goes_on(
    agent: AgentProcess,
) -> None:
    """A detached exec's own stream falls behind its ring (the server gives no window back)
    and is reset with GAP. Found by ASan in CI: the agent read the freed stream right after
    resetting it; this makes that path happen every time."""
    agent.hello(window=1024)
    sid = agent.open(
        "exec",
        argv=[SH, "-c", "head -c 20000 /dev/zero | tr '\\0' a; printf END"],
        env={},
        detach={"id": "fast", "buffer": 1024},
    )
    assert agent.read().type == OPEN_OK
    mine: list[Frame] = []
    deadline = time.monotonic() + 10
    while True:
        agent.send(encode_json(OPEN, agent.open_id(), {"kind": "processes"}))
        listed = agent.read_until(lambda f: f.type == OPEN_OK and "processes" in f.json())
        mine += [f for f in listed if f.stream == sid]
        if listed[-1].json()["processes"][0]["end"]["1"] >= 20003:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # Whether the ring overran the stream while it still had window, or only once the
    # window came back, the stream ends with GAP.
    agent.send(window(sid, 1 << 20))
    if not any(f.type == RESET for f in mine):
        mine += agent.stream_frames(sid)
    assert mine[-1].type == RESET and mine[-1].json()["error"] == "GAP", mine
    # The agent is whole: the process attaches again from its ring, and a command runs.
    att = agent.open("attach", id="fast", offsets={"1": 0, "2": 0})
    opened = agent.read_until(lambda f: f.stream == att)[-1]
    assert opened.type == OPEN_OK and opened.json()["start"]["1"] == 20003 - 1024
    assert output(agent.stream_frames(att)).endswith(b"END")
    assert exit_of(run(agent, "exit 3"))["exit_code"] == 3


def test_rings_past_the_budget_wrap_where_they_are(agent: AgentProcess) -> None:
    """Six running writers of 4 MB with 8 MiB rings each and a budget of 6 MiB for all: the
    agent's memory grows by about the budget, not by 24 MB (before the budget: 64 writers
    with 16 MiB rings could take a 256 MiB sandbox's memory and the agent, OOM-killed, ended
    the sandbox). A ring stopped by the budget keeps its newest output and says where it starts."""
    agent.hello()
    base = rss_bytes(agent.proc.pid)
    n, size, budget = 6, 4_000_000, 6 << 20
    for i in range(n):
        script = f"head -c {size} /dev/zero | tr '\\0' {'abcdef'[i]}; printf E; sleep 60"
        sid = agent.open(
            "exec",
            argv=[SH, "-c", script],
            env={},
            detach={"id": f"w{i}", "buffer": 8 << 20, "budget": budget},
        )
        assert agent.read_until(lambda f, sid=sid: f.stream == sid)[-1].type == OPEN_OK
        # Ending the exec stream leaves the process alone, writing into its ring.
        agent.send(encode_json(RESET, sid, {"error": "CANCELLED", "message": "not reading"}))
    deadline = time.monotonic() + 30
    while True:
        procs = agent.hello().json()["processes"]
        if all(p["end"]["1"] == size + 1 for p in procs) and len(procs) == n:
            break
        assert time.monotonic() < deadline, procs
        time.sleep(0.05)
    held = sum(p["end"]["1"] - p["start"]["1"] for p in procs)
    assert budget <= held <= budget + n * (128 << 10), procs  # a read past it, or the floor
    growth = rss_bytes(agent.proc.pid) - base
    assert growth < budget + (4 << 20), f"the agent grew by {growth} bytes"
    # A ring stopped early (the writers run at once: which ones is chance) still serves its
    # newest bytes, from where it now starts.
    wrapped = [p for p in procs if p["start"]["1"] > 0]
    assert wrapped, procs
    for p in wrapped[:2]:
        att = agent.open("attach", id=p["id"], offsets={"1": 0, "2": 0})
        opened = agent.read_until(lambda f, att=att: f.stream == att)[-1]
        assert opened.json()["start"]["1"] == p["start"]["1"]
        agent.send(encode(SIGNAL, att, bytes([signal.SIGKILL])))
        letter = b"abcdef"[int(p["id"][1:])]
        assert output(agent.stream_frames(att)) == bytes([letter]) * (size - p["start"]["1"]) + b"E"
    assert exit_of(run(agent, "exit 4"))["exit_code"] == 4


@pytest.mark.parametrize("budget", [0, -1, 1 << 41, "big", 1.5])
def test_a_bad_ring_budget_is_refused(agent: AgentProcess, budget: object) -> None:
    agent.hello()
    agent.open("exec", argv=["/bin/true"], env={}, detach={"id": "b", "budget": budget})
    reset = agent.read()
    assert reset.type == RESET and reset.json()["error"] == "INVALID", reset
    assert "budget" in reset.json()["message"]


def test_detached_errors_and_signal_through_attach(agent: AgentProcess) -> None:
    agent.hello()
    agent.open("exec", argv=["/bin/sleep", "30"], env={}, detach={"id": "d"})
    assert agent.read().type == OPEN_OK
    agent.open("exec", argv=["/bin/true"], env={}, detach={"id": "d"})
    assert agent.read().json()["error"] == "EXISTS"
    agent.hello()
    agent.open("forget", id="d")
    assert agent.read().json()["error"] == "RUNNING"
    agent.open("attach", id="nope", offsets={})
    assert agent.read().json()["error"] == "NOT_FOUND"
    agent.open("forget", id="nope")
    assert agent.read().json()["error"] == "NOT_FOUND"
    att = agent.open("attach", id="d", offsets={"1": 0, "2": 0})
    assert agent.read().type == OPEN_OK
    agent.send(encode(SIGNAL, att, bytes([signal.SIGKILL])))
    assert exit_of(agent.stream_frames(att)) == {"exit_code": 137, "signal": 9}


# ---------------------------------------------------------------- dial and egress


def test_dial_a_local_tcp_server(agent: AgentProcess) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            got = b""
            while chunk := conn.recv(65536):
                got += chunk
            conn.sendall(b"echo:" + got)

    t = threading.Thread(target=serve)
    t.start()
    try:
        agent.hello()
        sid = agent.open("dial", port=port)
        assert agent.read() == Frame(OPEN_OK, sid, b"{}")
        agent.send(data(sid, b"ping over the channel"))
        agent.send(encode(EOF, sid, b"\0"))
        frames = agent.stream_frames(sid)
        assert output(frames, 0) == b"echo:ping over the channel"
        assert [f.type for f in frames][-2:] == [EOF, CLOSE]
    finally:
        t.join(5)
        srv.close()
    # nobody listens any more
    sid = agent.open("dial", port=port)
    f = agent.read()
    assert (f.type, f.json()["error"]) == (RESET, "REFUSED")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_egress_listener_opens_streams(agent: AgentProcess) -> None:
    port = free_port()
    ok = agent.hello(egress_port=port).json()
    assert ok["egress_port"] == port
    c = socket.create_connection(("127.0.0.1", port), timeout=5)
    f = agent.read()
    assert f.type == OPEN and f.stream == 2 and f.json()["kind"] == "egress"
    assert f.json()["peer"].startswith("127.0.0.1:")
    c.sendall(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")
    time.sleep(0.1)
    assert agent.quiet(0.1) == []  # nothing read before OPEN_OK
    agent.send(encode(OPEN_OK, 2, b"{}"))
    got = agent.read()
    assert got.type == DATA and got.data.startswith(b"CONNECT example.com:443")
    agent.send(data(2, b"HTTP/1.1 200 OK\r\n\r\n"))
    assert c.recv(100) == b"HTTP/1.1 200 OK\r\n\r\n"
    c.shutdown(socket.SHUT_WR)
    assert agent.read() == Frame(EOF, 2, b"\0")
    agent.send(encode(EOF, 2, b"\0"))
    assert agent.read() == Frame(CLOSE, 2, b"")
    assert c.recv(10) == b""
    c.close()
    # a second connection, refused by the server: RESET closes it
    c2 = socket.create_connection(("127.0.0.1", port), timeout=5)
    f = agent.read()
    assert f.stream == 4
    agent.send(encode_json(RESET, 4, {"error": "DENIED", "message": "not allowed"}))
    assert c2.recv(10) == b""
    c2.close()
    # a new epoch without egress closes the listener
    assert agent.hello().json()["egress_port"] == 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_agent_exits_only_when_the_test_closes_its_input(agent: AgentProcess) -> None:
    agent.hello()
    agent.open("exec", argv=["/bin/sleep", "30"], env={}, detach={"id": "x"})
    pid = agent.read().json()["pid"]
    assert agent.close() == 0
    assert not alive(pid)


def test_frames_after_a_stream_ended_are_ignored(agent: AgentProcess) -> None:
    agent.hello()
    sid = agent.open("exec", argv=["/bin/true"], env={}, stdin=True)
    assert exit_of(agent.stream_frames(sid))["exit_code"] == 0
    # crossed the EXIT in flight: no answer, the epoch goes on
    for raw in (data(sid, b"late"), window(sid, 10), encode(EOF, sid, b"\0"), encode(CLOSE, sid)):
        agent.send(raw)
    agent.send(encode(PING, 0, b"after..."))
    assert agent.read() == Frame(PONG, 0, b"after...")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching identity needs root (CAP_SETUID)")
def test_user_option_runs_commands_under_that_identity(agent_helper: Helper) -> None:
    root = Path(tempfile.mkdtemp(prefix="sbx-agent-user-"))  # reachable by nobody, unlike tmp_path
    root.chmod(0o755)
    try:
        with running_agent(agent_helper, root, args=("--user", "65534:65534")) as a:
            a.hello()
            frames = run(a, "id -u; id -g; id -G; grep CapEff /proc/self/status")
            assert output(frames).split() == [b"65534", b"65534", b"65534", b"CapEff:", b"0" * 16]
    finally:
        shutil.rmtree(root)


def test_signal_relayed_by_the_sbx_run_supervisor(
    agent: AgentProcess, agent_helper: Helper, tmp_path: Path
) -> None:
    """SIGNAL with relay 1 reaches the command under `sbx run` (which traps it); without relay
    it reaches the supervisor, which ends the whole tree."""
    agent.hello()
    script = "trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 0.05; done"
    argv = [str(agent_helper.path), "--root", str(tmp_path), "run", "--", SH, "-c", script]
    env = {"PATH": "/usr/bin:/bin"}
    sid = agent.open("exec", argv=argv, env=env)
    assert agent.read().type == OPEN_OK
    assert agent.read().data == b"ready\n"
    agent.send(encode(SIGNAL, sid, bytes([signal.SIGINT, 1])))
    frames = agent.stream_frames(sid)
    assert output(frames) == b"got-int\n" and exit_of(frames)["exit_code"] == 5
    sid = agent.open("exec", argv=argv, env=env)
    assert agent.read().type == OPEN_OK
    assert agent.read().data == b"ready\n"
    agent.send(encode(SIGNAL, sid, bytes([signal.SIGINT])))
    frames = agent.stream_frames(sid)
    assert output(frames) == b"" and exit_of(frames)["exit_code"] == 137
    sid = agent.open("exec", argv=["/bin/sleep", "30"], env={})
    assert agent.read().type == OPEN_OK
    agent.send(encode(SIGNAL, sid, bytes([signal.SIGINT, 2])))  # no such relay
    f = agent.read()
    assert (f.type, f.stream, f.json()["error"]) == (RESET, sid, "PROTOCOL")


def test_sbx_run_is_supervised_by_the_agent_itself(
    agent: AgentProcess, agent_helper: Helper, tmp_path: Path
) -> None:
    """An exec of the agent's own `sbx run` is one process under the agent (no supervisor or
    monitor between them) with the supervisor's answers: the exit code, the error line of a
    command that is not found, `sbx kill` and `sbx status` of its token."""
    agent.hello()
    helper = str(agent_helper.path)

    def sbx_run(*args: str, token: str = "p-t") -> int:
        argv = [helper, "--root", str(tmp_path), "run", "--id", token, *args]
        return agent.open("exec", argv=argv, env={"PATH": "/usr/bin:/bin", "LD_PRELOAD": "x"})

    frames = agent.stream_frames(sbx_run("--", "sh", "-c", 'echo $PPID "$LD_PRELOAD"; exit 3'))
    assert output(frames) == f"{agent.proc.pid} \n".encode() and exit_of(frames)["exit_code"] == 3
    frames = agent.stream_frames(sbx_run("--", "no-such-command-here"))
    assert exit_of(frames)["exit_code"] == 127
    assert b'"error":"ENOENT"' in output(frames, 2), frames
    sid = sbx_run("--", "sh", "-c", "setsid sleep 4646 & echo ready; exec sleep 30", token="p-k")
    assert agent.read().type == OPEN_OK
    assert agent.read().data == b"ready\n"
    killed = agent.stream_frames(agent.open("exec", argv=[helper, "kill", "p-k"], env={}))
    assert exit_of(killed)["exit_code"] == 0
    frames = agent.stream_frames(sid)
    assert exit_of(frames) == {"exit_code": 137, "signal": None}
    leftover = run(agent, "pgrep -f 'sleep 464[6]' || true")
    assert output(leftover) == b"", leftover  # the tree went before the EXIT
    frames = agent.stream_frames(sbx_run("--", "sh", "-c", "kill -TERM $$", token="p-s"))
    assert exit_of(frames) == {"exit_code": 143, "signal": None}
    status = agent.stream_frames(agent.open("exec", argv=[helper, "status", "p-s"], env={}))
    assert output(status) == b"signal 15\n" and exit_of(status)["exit_code"] == 0


def test_egress_connection_outside_an_epoch_is_closed(agent: AgentProcess) -> None:
    port = free_port()
    agent.hello(egress_port=port, keepalive_ms=100)
    agent.read_until(lambda f: f.type == GOAWAY, timeout=5)  # the epoch ends, the port stays
    c = socket.create_connection(("127.0.0.1", port), timeout=5)
    assert c.recv(10) == b""
    c.close()
    assert agent.quiet(0.2) == []


def test_a_frame_begun_is_finished_when_the_epoch_ends(agent: AgentProcess) -> None:
    """The reader stops while the agent is mid-frame (its output pipe full); a new epoch drops
    the queued frames but the one begun is written whole: the stream stays parseable up to the
    new HELLO_OK (the codec raises on any length out of range)."""
    agent.hello(window=16 * 1024 * 1024)
    sid = agent.open("exec", argv=["/usr/bin/head", "-c", "20000000", "/dev/zero"], env={})
    time.sleep(0.5)  # nobody reads: the pipe and the agent's queue fill
    ok = agent.hello()
    assert ok.type == 0x02
    agent.send(encode(PING, 0, b"aligned!"))
    assert agent.read() == Frame(PONG, 0, b"aligned!")
    assert sid == 1
