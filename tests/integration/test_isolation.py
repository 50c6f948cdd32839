"""Isolation tiers on the real engine: the hardened profile holds under both runc and runsc, and
gVisor-specific hostile cases (the sandbox sees gVisor's kernel, never the host's)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from conftest import Stubs, expect_error, run, start_server
from sandboxd.v1 import admin_pb2, common_pb2, session_pb2

TIERS = ("runc", "gvisor")
_PB = {"runc": common_pb2.ISOLATION_RUNC, "gvisor": common_pb2.ISOLATION_GVISOR}


def test_server_info_lists_the_tiers_the_engine_runs(stubs: Stubs, tier: str) -> None:
    info = stubs.admin.GetServerInfo(admin_pb2.GetServerInfoRequest())
    # The tier fixture skips gvisor where runsc is absent, so here both are registered.
    assert list(info.isolation_tiers) == [common_pb2.ISOLATION_RUNC, common_pb2.ISOLATION_GVISOR]


def test_the_session_echoes_its_tier_and_runs_under_it(
    stubs: Stubs, new_session, tier: str
) -> None:
    s = new_session()
    assert s.isolation == _PB[tier]  # the server's default for this module's tier
    got = stubs.sessions.GetSession(session_pb2.GetSessionRequest(session_id=s.session_id))
    assert got.session.isolation == _PB[tier]
    dmesg = run(stubs, s.session_id, "dmesg")
    if tier == "gvisor":
        assert b"gVisor" in dmesg.stdout, dmesg
    else:
        assert b"gVisor" not in dmesg.stdout + dmesg.stderr


def test_the_host_kernel_is_not_visible_under_gvisor(stubs: Stubs, new_session, tier: str) -> None:
    if tier != "gvisor":
        pytest.skip("gVisor-specific")
    host = Path("/proc/version").read_bytes()
    release = Path("/proc/sys/kernel/osrelease").read_bytes().strip()
    s = new_session()
    seen = run(stubs, s.session_id, "cat", "/proc/version")
    assert seen.exit_code == 0 and seen.stdout and seen.stdout != host
    assert release not in seen.stdout
    # Nor the host's processes: the sandbox's /proc holds only its own few.
    procs = run(stubs, s.session_id, "sh", "-c", "ls /proc | grep -c '^[0-9]'")
    assert int(procs.stdout) < 10


def test_the_hardened_profile_holds(stubs: Stubs, new_session, tier: str) -> None:
    s = new_session(limits=common_pb2.ResourceLimits(pids=32))
    sid = s.session_id
    assert run(stubs, sid, "id", "-u").stdout.decode() == s.user.partition(":")[0] + "\n"
    assert run(stubs, sid, "touch", "/rootfs-write").exit_code != 0  # read-only root
    assert run(stubs, sid, "sh", "-c", "echo hi > /workspace/f && cat /workspace/f").stdout == (
        b"hi\n"
    )
    mounts = run(stubs, sid, "cat", "/proc/mounts").stdout.decode()
    assert any(" /workspace " in line and "tmpfs" in line for line in mounts.splitlines()), mounts
    caps = run(stubs, sid, "grep", "CapEff", "/proc/self/status").stdout
    assert caps.split()[-1] == b"0000000000000000", caps
    # Writing the helper (bind-mounted read-only) fails.
    assert run(stubs, sid, "sh", "-c", "echo x > /.sandboxd/sbx").exit_code != 0
    # The pids limit: 60 background sleeps cannot all start.
    forks = run(
        stubs,
        sid,
        "sh",
        "-c",
        "for i in $(seq 60); do sleep 5 & done 2>/dev/null; ps | grep -c 'sleep 5'",
    )
    assert int(forks.stdout or b"0") < 32, forks


def test_allowlist_networking_is_allowed_under_gvisor(stubs: Stubs, tier: str) -> None:
    """No sandbox has a network interface (runsc runs with --network=none): egress goes over
    the agent's channel, so ALLOWLIST works under gVisor too. Its proxy answers from inside."""
    if tier != "gvisor":
        pytest.skip("gVisor-specific")
    session = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            isolation=common_pb2.ISOLATION_GVISOR,
            shell=common_pb2.ShellPolicy(allow_all=True),
            network=common_pb2.NetworkPolicy(
                mode=common_pb2.NETWORK_MODE_ALLOWLIST,
                allowed_domains=["example.com"],
                allowed_ports=[443],
            ),
        )
    ).session
    sid = session.session_id
    try:
        links = run(stubs, sid, "ls", "/sys/class/net").stdout.decode().split()
        assert links == ["lo"], links
        ask = 'printf "CONNECT other.test:443 HTTP/1.1\r\n\r\n" | nc -w 5 127.0.0.1 3128'
        out = run(stubs, sid, "sh", "-c", ask).stdout.decode()
        assert out.startswith("HTTP/1.1 403") and "NAME_NOT_ALLOWED" in out, out
    finally:
        stubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


def test_a_tier_the_operator_forbids_is_refused(tmp_path, tier: str) -> None:
    if tier != "runc":
        pytest.skip("one server is enough")
    from conftest import make_stubs, remove_owned_containers

    srv = start_server(tmp_path, "tiersonly", "--isolation-allowed", "runc")
    try:
        stubs = make_stubs(srv.address)
        info = stubs.admin.GetServerInfo(admin_pb2.GetServerInfoRequest())
        assert list(info.isolation_tiers) == [common_pb2.ISOLATION_RUNC]
        expect_error(
            lambda: stubs.sessions.CreateSession(
                session_pb2.CreateSessionRequest(isolation=common_pb2.ISOLATION_GVISOR)
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "ISOLATION_NOT_ALLOWED",
        )
        stubs.channel.close()
    finally:
        srv.stop()
        remove_owned_containers("tiersonly")


def test_suspend_and_resume_keep_the_tier_and_the_workspace(
    stubs: Stubs, new_session, tier: str
) -> None:
    s = new_session()
    sid = s.session_id
    assert run(stubs, sid, "sh", "-c", "echo kept > /workspace/f").exit_code == 0
    stubs.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=sid))
    resumed = stubs.sessions.ResumeSession(session_pb2.ResumeSessionRequest(session_id=sid))
    assert resumed.session.isolation == _PB[tier]
    assert run(stubs, sid, "cat", "/workspace/f").stdout == b"kept\n"
    kernel = run(stubs, sid, "cat", "/proc/version").stdout
    assert (b"4.4.0" in kernel) == (tier == "gvisor")  # gVisor reports a fixed 4.4.0


def test_the_python_template_runs_python(stubs: Stubs, new_session, tier: str) -> None:
    s = new_session(template="python")
    assert s.template == "python" and s.image == "sandboxd-runtime:python"
    out = run(
        stubs,
        s.session_id,
        "python3",
        "-c",
        "import json, sys; print(json.dumps(sys.version_info[:2]))",
    )
    assert out.exit_code == 0 and out.stdout.startswith(b"[3, "), out
    expect_error(
        lambda: stubs.sessions.CreateSession(session_pb2.CreateSessionRequest(template="nope")),
        grpc.StatusCode.NOT_FOUND,
        "TEMPLATE_NOT_FOUND",
    )
