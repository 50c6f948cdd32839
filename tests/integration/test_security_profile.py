"""Every default of SECURITY.md's container profile, read back with `docker inspect`
and observed from inside the container."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import ServerProcess, Stubs, run
from containers import SOCKET_CHANNEL, SOCKET_DIR, agent_cmd, inspect_container, session_container
from sandboxd.v1 import admin_pb2, common_pb2, session_pb2

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def default_session(stubs: Stubs) -> Any:
    s = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
    ).session
    yield s
    stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=s.session_id))


@pytest.fixture(scope="module")
def inspected(default_session: session_pb2.Session, server: ServerProcess) -> dict[str, Any]:
    return inspect_container(session_container(default_session.session_id, running=True))


def _uid(session: session_pb2.Session) -> str:
    """The session's own host uid (its gid the same number): allocated by the server."""
    uid, _, gid = session.user.partition(":")
    assert uid == gid and 1_900_000_000 <= int(uid) < 1_900_065_536, session.user
    return uid


def test_host_config(inspected: dict[str, Any], default_session: session_pb2.Session) -> None:
    hc = inspected["HostConfig"]
    uid = _uid(default_session)
    assert hc["ReadonlyRootfs"] is True
    # The agent (PID 1) alone holds these three, to start each command as the session's uid
    # and gid and signal it; the commands hold none (test_seen_from_inside).
    assert hc["CapDrop"] == ["ALL"]
    assert sorted(c.removeprefix("CAP_") for c in hc["CapAdd"]) == ["KILL", "SETGID", "SETUID"]
    assert "no-new-privileges:true" in hc["SecurityOpt"]
    assert not any(o.startswith("seccomp=unconfined") for o in hc["SecurityOpt"])
    assert hc["Privileged"] is False
    assert hc["NetworkMode"] == "none"
    assert hc["Memory"] == 256 * MiB and hc["MemorySwap"] == 256 * MiB
    assert hc["NanoCpus"] == 500_000_000
    assert hc["PidsLimit"] == 64
    # The agent is PID 1 itself (docs/agent.md): no Docker init in front of it.
    assert hc["Init"] is False
    assert hc["Tmpfs"]["/workspace"] == (
        f"rw,nosuid,nodev,size=67108864,uid={uid},gid={uid},mode=0700"
    )
    assert "noexec" in hc["Tmpfs"]["/tmp"]
    assert hc["IpcMode"] == "private"
    # Read-only, but for the agent socket's own directory (agent_socket: its runc channel).
    socket_binds = [b for b in hc["Binds"] if b.endswith(f":{SOCKET_DIR}:rw")]
    assert len(socket_binds) == (1 if SOCKET_CHANNEL else 0), hc["Binds"]
    assert all(b.endswith(":ro") for b in hc["Binds"] if b not in socket_binds)


def test_config_and_labels(
    inspected: dict[str, Any], default_session: session_pb2.Session, server: ServerProcess
) -> None:
    cfg = inspected["Config"]
    assert cfg["User"] == "0:0"  # the agent, which runs every command as the session's user
    assert cfg["Cmd"] == agent_cmd(default_session.user)
    assert cfg["OpenStdin"] is True
    labels = cfg["Labels"]
    assert labels["io.sandboxd.owner"] == server.owner_id
    assert labels["io.sandboxd.session"] == default_session.session_id
    assert labels["io.sandboxd.fingerprint"] == default_session.fingerprint
    env_keys = {e.split("=", 1)[0] for e in cfg["Env"]}
    assert env_keys <= {"PATH", "HOME", "LANG"}, env_keys


def test_seen_from_inside(stubs: Stubs, default_session: session_pb2.Session) -> None:
    sid = default_session.session_id
    uid = _uid(default_session)
    assert run(stubs, sid, "id", "-u").stdout.decode() == f"{uid}\n"
    assert run(stubs, sid, "id", "-g").stdout.decode() == f"{uid}\n"
    status = run(stubs, sid, "cat", "/proc/self/status").stdout.decode()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert int(fields["CapEff"], 16) == 0 and int(fields["CapPrm"], 16) == 0
    assert int(fields["CapInh"], 16) == 0 and int(fields["CapAmb"], 16) == 0
    # The bounding set is the container's (the agent's three: dropping it needs CAP_SETPCAP);
    # with no-new-privileges an execve grants nothing within it.
    assert int(fields["CapBnd"], 16) == (1 << 5) | (1 << 6) | (1 << 7)  # KILL, SETGID, SETUID
    assert fields["Groups"].strip() == ""
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"  # filter mode: Docker's default profile
    # read-only root, writable workspace, noexec /tmp
    assert run(stubs, sid, "touch", "/etc/x").exit_code != 0
    assert run(stubs, sid, "touch", "/workspace/x").exit_code == 0
    r = run(stubs, sid, "sh", "-c", "cp /bin/busybox /tmp/bb && /tmp/bb true")
    assert r.exit_code != 0 and b"denied" in r.stderr.lower()
    # no network but loopback
    links = run(stubs, sid, "cat", "/proc/net/dev").stdout.decode()
    interfaces = {line.split(":")[0].strip() for line in links.splitlines()[2:]}
    assert interfaces == {"lo"}
    # limits visible from the cgroup
    mem = run(stubs, sid, "cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
    if mem.exit_code == 0:
        assert int(mem.stdout) == 256 * MiB
    # the workspace tmpfs has the declared size and owner
    df = run(stubs, sid, "df", "-k", "/workspace").stdout.decode().splitlines()[-1].split()
    assert int(df[1]) == 64 * 1024
    assert run(stubs, sid, "stat", "-c", "%u %a", "/workspace").stdout.decode() == f"{uid} 700\n"


def test_pids_limit_holds(stubs: Stubs, default_session: session_pb2.Session) -> None:
    sid = default_session.session_id
    assert run(stubs, sid, "cat", "/sys/fs/cgroup/pids/pids.max").stdout == b"64\n"
    r = run(stubs, sid, "sh", "-c", "i=0; while [ $i -lt 100 ]; do sleep 5 & i=$((i+1)); done")
    assert r.exit_code != 0 and b"fork" in r.stderr.lower(), r
    # the sleeps that did start died with their command
    count = run(stubs, sid, "sh", "-c", "set -- /proc/[0-9]*; echo $#")
    assert int(count.stdout) < 8


def test_server_info_reports_the_defaults(stubs: Stubs) -> None:
    info = stubs.admin.GetServerInfo(admin_pb2.GetServerInfoRequest())
    assert info.version and info.docker_api_version
    d = info.security_defaults
    # No one identity: the block each session is allocated its own uid from.
    assert d.user == "1900000000-1900065535"
    assert d.read_only_root_filesystem and d.no_new_privileges
    assert list(d.capabilities_dropped) == ["ALL"] and d.init
    assert d.network_mode == common_pb2.NETWORK_MODE_DENY
    assert d.commands_denied_by_default
    assert d.limits.memory_bytes == 256 * MiB and d.limits.pids == 64
    assert d.limits.cpu_millis == 500 and d.limits.command_timeout.seconds == 10
    assert d.limits.output_bytes == MiB and d.limits.file_bytes == MiB
    assert d.limits.workspace_bytes == 64 * MiB and d.lease_seconds == 900
    assert info.limits_max.memory_bytes >= d.limits.memory_bytes
    assert info.assurance == common_pb2.ASSURANCE_ENFORCED
