"""Through the server, under runc and gVisor alike: a session's commands are run by its agent
(PID 1, root with only CAP_SETUID, CAP_SETGID and CAP_KILL, `sbx agent --user UID:GID`), as the
session's uid and gid with no supplementary group and no capability, and nothing the sandbox user
does to the agent (signals, /proc, ptrace, prlimit) ends, stops, limits or reads it: the session
keeps working, in the same container, without a rescue (docs/agent.md, "What protects the
agent")."""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import ServerProcess, SessionFactory, Stubs, run, wait_until
from containers import agent_cmd, inspect_container, session_container

TIERS = ("runc", "gvisor")
RUNTIMES = {"runc": "runc", "gvisor": "runsc"}
USER = "1234:4321"  # asked for; the session runs as the host uid the server allocated it


def _agent(user: str, tier: str) -> list[str]:
    return agent_cmd(user, tier)


def _container(sid: str, server: ServerProcess) -> dict[str, Any]:
    return inspect_container(session_container(sid, server.owner_id))


def _status(stubs: Stubs, sid: str) -> dict[str, str]:
    text = run(stubs, sid, "cat", "/proc/self/status").stdout.decode()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines())}


def test_the_agent_runs_the_commands_as_the_session_with_nothing_of_its_own(
    stubs: Stubs, server: ServerProcess, new_session: SessionFactory, tier: str
) -> None:
    session = new_session(user=USER)
    sid, uid = session.session_id, session.user.partition(":")[0]
    assert session.user == f"{uid}:{uid}" and session.user != USER
    doc = _container(sid, server)
    config, host = doc["Config"], doc["HostConfig"]
    assert config["Cmd"] == _agent(session.user, tier) and config["User"] == "0:0"
    assert host["Runtime"] == RUNTIMES[tier] and host["Init"] is False
    assert host["CapDrop"] == ["ALL"]
    assert sorted(c.removeprefix("CAP_") for c in host["CapAdd"]) == ["KILL", "SETGID", "SETUID"]
    assert host["SecurityOpt"] == ["no-new-privileges:true"] and host["ReadonlyRootfs"] is True
    ids = run(stubs, sid, "/bin/sh", "-c", "id -u; id -g; id -G")
    assert ids.stdout.decode().split() == [uid] * 3, ids
    status = _status(stubs, sid)
    assert status["Uid"].split() == [uid] * 4 and status["Gid"].split() == [uid] * 4
    assert status["Groups"] == ""  # the agent dropped its own (root's) supplementary groups
    for field in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(status.get(field, "0"), 16) == 0, (field, status)
    if tier == "runc":  # gVisor's status has no such line (its Sentry runs under both)
        assert status["NoNewPrivs"] == "1"
    # The OOM killer takes a command before the agent.
    assert run(stubs, sid, "cat", "/proc/self/oom_score_adj").stdout == b"1000\n"
    # Run by the agent itself: the command's parent is PID 1, the --user agent (its
    # supervisor too), and the engine made no `docker exec` for any of it.
    chain = run(
        stubs,
        sid,
        "/bin/sh",
        "-c",
        'ppid() { sed -n "s/^PPid:\\t//p" /proc/$1/status; }; '
        "echo $(ppid $$) $(tr '\\0' ' ' < /proc/1/cmdline)",
    )
    parent, *cmdline = chain.stdout.decode().split()
    assert parent == "1" and cmdline == _agent(session.user, tier), chain
    assert not _container(sid, server).get("ExecIDs")


# What the sandbox user tries against the agent; each must fail and leave the session working.
PYTHON_PTRACE = (
    "import ctypes\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "for req in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE\n"
    "    print(libc.ptrace(req, 1, 0, 0), ctypes.get_errno())\n"
)
ATTACKS = {
    "kill -9 -1": ["/bin/sh", "-c", "sleep 300 & kill -9 -1; echo survived"],
    "kill -KILL 1": ["/bin/sh", "-c", "kill -KILL 1; kill -TERM 1; kill -INT 1; kill -HUP 1"],
    "kill -STOP -1": ["/bin/sh", "-c", "kill -STOP -1; kill -STOP 1; kill -TSTP 1"],
    "/proc/1": ["/bin/sh", "-c", "cat /proc/1/environ; exec 3</proc/1/mem; echo opened"],
    "ptrace": ["python3", "-c", PYTHON_PTRACE],
    "prlimit": ["prlimit", "--pid", "1", "--nofile=4:4", "--cpu=1:1"],
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_nothing_the_sandbox_user_does_reaches_the_agent(
    stubs: Stubs, server: ServerProcess, new_session: SessionFactory, tier: str, attack: str
) -> None:
    sid = new_session(template="python").session_id
    assert run(stubs, sid, "/bin/sh", "-c", "echo kept > /workspace/f").exit_code == 0
    before = _container(sid, server)
    rescues = sum("does not answer" in line for line in server.log_lines)
    result = run(stubs, sid, *ATTACKS[attack])
    said = result.stdout + result.stderr
    if attack == "/proc/1":
        assert b"opened" not in said and b"PATH=" not in said, said
    elif attack == "ptrace":
        assert [line.split()[0] for line in result.stdout.splitlines()] == [b"-1", b"-1"], said
    elif attack == "prlimit":
        assert result.exit_code != 0 and b"not permitted" in said, said
    if tier == "runc":  # gVisor has no /proc/PID/limits; prlimit's refusal above says it all
        limits = run(stubs, sid, "cat", "/proc/1/limits").stdout.decode()
        assert " 4 " not in limits.split("Max open files")[1].splitlines()[0], limits
    # The same agent in the same container, not stopped, the workspace whole, no rescue.
    r = run(stubs, sid, "/bin/sh", "-c", "cat /workspace/f; grep State /proc/1/status")
    assert r.stdout.startswith(b"kept\n") and b"stopped" not in r.stdout, r
    after = _container(sid, server)
    assert after["Id"] == before["Id"] and after["State"]["Running"] is True
    assert after["State"]["StartedAt"] == before["State"]["StartedAt"]
    assert not after.get("ExecIDs")
    assert sum("does not answer" in line for line in server.log_lines) == rescues


def test_an_orphan_dies_with_its_command(stubs: Stubs, new_session: SessionFactory) -> None:
    """The orphan test: the command kills its own supervisor; what it left behind is
    reparented to the agent, which kills it."""
    sid = new_session().session_id
    run(stubs, sid, "/bin/sh", "-c", "sleep 4242 & kill -KILL $PPID")
    run(stubs, sid, "/bin/sh", "-c", "setsid sh -c 'sleep 4343 &'; exit 0")

    def gone() -> bool:
        ps = run(stubs, sid, "ps", "-o", "args").stdout
        return b"sleep 4242" not in ps and b"sleep 4343" not in ps

    assert wait_until(gone, timeout=10)
    assert run(stubs, sid, "echo", "alive").stdout == b"alive\n"


def test_a_fork_bomb_leaves_the_agent_able_to_start_commands(
    stubs: Stubs, new_session: SessionFactory
) -> None:
    """The agent forks every command as root and switches to the session's uid: the pids limit
    of the session (its uid's processes under gVisor, the cgroup under runc) holds, and once the
    bomb is gone the next command starts."""
    from google.protobuf import duration_pb2
    from sandboxd.v1 import common_pb2

    sid = new_session(limits=common_pb2.ResourceLimits(pids=16)).session_id
    run(
        stubs,
        sid,
        "/bin/sh",
        "-c",
        "bomb() { bomb | bomb & }; bomb",
        timeout=duration_pb2.Duration(seconds=2),
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            if run(stubs, sid, "echo", "alive").stdout == b"alive\n":
                break
        except Exception:
            pass
        assert time.monotonic() < deadline, "the session never ran a command again"
        time.sleep(0.5)
