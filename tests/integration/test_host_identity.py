"""Each session runs as a host identity of its own, on both isolation tiers: one tenant that
exhausts a kernel count kept per uid (inotify instances, fs.inotify.max_user_instances) leaves
another tenant's WatchDir and in-sandbox file watchers working, and its own WatchDir is told
KERNEL_LIMIT_REACHED, not WORKSPACE_FULL. The uid is allocated by the server whatever `user`
the request asked (both sessions here ask for the same one: the case where two tenants would
share a pool if a requested uid were honoured), kept across suspend and resume, a fork's own,
and the restored files are owned by it."""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from authutil import authed_stubs, write_tokens
from conftest import (
    ServerProcess,
    Stubs,
    error_info,
    expect_error,
    make_stubs,
    own_server,
    remove_owned_containers,
    run,
    start_server,
)
from containers import session_container
from google.protobuf import duration_pb2
from sandboxd.v1 import (
    common_pb2,
    process_pb2,
    session_pb2,
    snapshot_pb2,
    snapshot_pb2_grpc,
    watch_pb2,
)

TIERS = ("runc", "gvisor")
ALPHA = "alpha-" + secrets.token_urlsafe(24)
BETA = "beta-" + secrets.token_urlsafe(24)
EXHAUSTED = "HOST_IDS_EXHAUSTED"
ASKED = "4242:4242"  # what both tenants ask for; no one else on the host is this uid

# Opens inotify instances until the kernel refuses (at most 4096: gVisor's Sentry keeps no
# per-user count) and holds them; /workspace/held says how many and why it stopped.
HOLDER = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
why = "cap"
while len(fds) < 4096:
    fd = libc.inotify_init1(0)
    if fd < 0:
        why = os.strerror(ctypes.get_errno())
        break
    fds.append(fd)
with open("/workspace/held.tmp", "w") as f:
    f.write(f"{len(fds)} {why}")
os.rename("/workspace/held.tmp", "/workspace/held")
time.sleep(120)
"""
ONE_WATCH = """
import ctypes, os
fd = ctypes.CDLL(None, use_errno=True).inotify_init1(0)
print("ok" if fd >= 0 else os.strerror(ctypes.get_errno()))
"""


@pytest.fixture(scope="module")
def id_server(tier: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("host-identity")
    tokens = write_tokens(data / "tokens", {ALPHA: "alpha", BETA: "beta"})
    owner = "hid" + secrets.token_hex(4)
    extra = ("--isolation-default", tier) if tier != "runc" else ()
    with own_server(data / "data", owner, "--tokens-file", str(tokens), *extra) as srv:
        yield srv


@pytest.fixture(scope="module")
def alpha(id_server: ServerProcess) -> Iterator[Stubs]:
    """Named on id_server (not tenant_fixture's lookup) so a new tier gets new stubs."""
    s = authed_stubs(id_server.address, ALPHA)
    yield s
    s.channel.close()


@pytest.fixture(scope="module")
def beta(id_server: ServerProcess) -> Iterator[Stubs]:
    s = authed_stubs(id_server.address, BETA)
    yield s
    s.channel.close()


def _python_session(s: Stubs) -> session_pb2.Session:
    return s.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            template="python", user=ASKED, shell=common_pb2.ShellPolicy(allow_all=True)
        )
    ).session


def _delete(s: Stubs, sid: str) -> None:
    s.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=sid))


def _watch_error(s: Stubs, sid: str) -> grpc.RpcError | None:
    """None when a WatchDir of the workspace gets in place, else its error."""
    call = s.files.WatchDir(watch_pb2.WatchDirRequest(session_id=sid), timeout=30)
    try:
        if dict(call.initial_metadata()).get("sandboxd-watch") == "ready":
            return None
        next(iter(call))
    except grpc.RpcError as err:
        return err
    finally:
        call.cancel()
    raise AssertionError("the watch was neither ready nor refused")


def _held(s: Stubs, sid: str) -> tuple[int, str]:
    for _ in range(100):
        r = run(s, sid, "cat", "/workspace/held")
        if r.exit_code == 0:
            count, _, why = r.stdout.decode().partition(" ")
            return int(count), why
        run(s, sid, "sleep", "0.2")
    raise AssertionError("the holder never said how many instances it holds")


def _owners(s: Stubs, sid: str, *paths: str) -> list[int]:
    """The owning uid of each path (python's stat: coreutils' statx fails under gVisor)."""
    code = "import os, sys; print(*(os.stat(p).st_uid for p in sys.argv[1:]))"
    r = run(s, sid, "python3", "-c", code, *paths)
    assert r.exit_code == 0, r
    return [int(v) for v in r.stdout.split()]


def _uid(session: session_pb2.Session) -> int:
    uid, _, gid = session.user.partition(":")
    assert uid == gid, session.user
    return int(uid)


def test_one_tenant_exhausting_inotify_leaves_the_other_working(
    alpha: Stubs, beta: Stubs, tier: str
) -> None:
    a, b = _python_session(alpha), _python_session(beta)
    try:
        assert a.user != b.user and ASKED not in (a.user, b.user)
        alpha.processes.StartProcess(
            process_pb2.StartProcessRequest(
                session_id=a.session_id,
                argv=["python3", "-c", HOLDER],
                timeout=duration_pb2.Duration(seconds=120),
            )
        )
        count, why = _held(alpha, a.session_id)
        # The other tenant: its WatchDir and its own file watchers are untouched.
        err = _watch_error(beta, b.session_id)
        assert err is None, (err, error_info(err))
        r = run(beta, b.session_id, "python3", "-c", ONE_WATCH)
        assert r.stdout == b"ok\n", r
        if tier == "runc":  # the host kernel's count for the uid: fs.inotify.max_user_instances
            limit = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
            assert count <= limit and why == "Too many open files", (count, why)
            err = _watch_error(alpha, a.session_id)
            assert err is not None and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_info(err).reason == "KERNEL_LIMIT_REACHED", error_info(err)
        else:  # gVisor's Sentry keeps no per-user count of instances: nothing to exhaust
            assert count == 4096 and why == "cap", (count, why)
    finally:
        _delete(alpha, a.session_id)
        _delete(beta, b.session_id)


def test_sessions_run_as_their_own_host_uid(alpha: Stubs, beta: Stubs, tier: str) -> None:
    a, b = _python_session(alpha), _python_session(beta)
    try:
        for s, session in ((alpha, a), (beta, b)):
            uid = _uid(session)
            assert 1_900_000_000 <= uid < 1_900_000_000 + 65536
            ids = run(s, session.session_id, "/bin/sh", "-c", "id -u; id -g")
            assert ids.stdout.decode().split() == [str(uid)] * 2, ids
            assert _owners(s, session.session_id, "/workspace") == [uid]
        if tier == "runc":  # the host's view: each command's process is that host uid
            for s, session in ((alpha, a), (beta, b)):
                s.processes.StartProcess(
                    process_pb2.StartProcessRequest(
                        session_id=session.session_id, argv=["sleep", "30"]
                    )
                )
                uids = _host_uids_of_commands(session.session_id)
                assert uids == {_uid(session)}, uids
    finally:
        _delete(alpha, a.session_id)
        _delete(beta, b.session_id)


def test_suspend_keeps_the_uid_and_a_fork_gets_its_own(alpha: Stubs, tier: str) -> None:
    a = _python_session(alpha)
    forks: list[str] = []
    try:
        sid, uid = a.session_id, _uid(a)
        assert run(alpha, sid, "sh", "-c", "mkdir d && echo x > d/f").exit_code == 0
        alpha.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=sid))
        resumed = alpha.sessions.ResumeSession(
            session_pb2.ResumeSessionRequest(session_id=sid)
        ).session
        assert resumed.user == a.user
        assert _owners(alpha, sid, "/workspace", "/workspace/d", "/workspace/d/f") == [uid] * 3
        snaps = snapshot_pb2_grpc.SnapshotServiceStub(alpha.channel)
        users = {a.user}
        for kind in (snapshot_pb2.SNAPSHOT_KIND_TAR, snapshot_pb2.SNAPSHOT_KIND_IMAGE):
            snap = snaps.CreateSnapshot(
                snapshot_pb2.CreateSnapshotRequest(session_id=sid, kind=kind)
            ).snapshot
            fork = alpha.sessions.CreateSession(
                session_pb2.CreateSessionRequest(
                    from_snapshot_id=snap.snapshot_id,
                    template="python",
                    shell=common_pb2.ShellPolicy(allow_all=True),
                )
            ).session
            forks.append(fork.session_id)
            assert fork.user not in users, kind  # its own, not its source's nor another fork's
            users.add(fork.user)
            owners = _owners(alpha, fork.session_id, "/workspace", "/workspace/d/f")
            assert owners == [_uid(fork)] * 2, kind
            assert run(alpha, fork.session_id, "sh", "-c", "echo y >> d/f").exit_code == 0
    finally:
        for made in (a.session_id, *forks):
            _delete(alpha, made)


def _host_uids_of_commands(session_id: str) -> set[int]:
    """The host uids (real, effective, saved, filesystem) of the agent's children, read from
    the host's /proc: the agent is the container's main process."""
    pid = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Pid}}", session_container(session_id, running=True)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for _ in range(50):
        children = " ".join(p.read_text() for p in Path(f"/proc/{pid}/task").glob("*/children"))
        if children.split():
            break
        time.sleep(0.1)
    uids: set[int] = set()
    for child in children.split():
        status = Path(f"/proc/{child}/status").read_text()
        line = next(ln for ln in status.splitlines() if ln.startswith("Uid:"))
        uids |= {int(v) for v in line.split()[1:]}
    return uids


def test_a_used_up_block_refuses_and_records_hold_their_ids_across_a_restart(
    tmp_path: Path,
) -> None:
    """Two ids: two sessions hold them, a third create is HOST_IDS_EXHAUSTED with nothing
    made, also while one is suspended and after a restart (the ids are in the records); the
    delete of one frees its id for the next create."""
    owner = "hidb" + secrets.token_hex(4)
    block = ("--host-uid-first", "1950000000", "--host-uid-count", "2")
    srv = start_server(tmp_path / "data", owner, *block)
    try:
        s = make_stubs(srv.address)
        a, b = (_default_session(s) for _ in range(2))
        assert {a.user, b.user} == {"1950000000:1950000000", "1950000001:1950000001"}
        expect_error(lambda: _default_session(s), grpc.StatusCode.RESOURCE_EXHAUSTED, EXHAUSTED)
        s.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=a.session_id))
        expect_error(lambda: _default_session(s), grpc.StatusCode.RESOURCE_EXHAUSTED, EXHAUSTED)
        s.channel.close()
        srv.stop()
        srv = start_server(tmp_path / "data", owner, *block)
        s = make_stubs(srv.address)
        expect_error(lambda: _default_session(s), grpc.StatusCode.RESOURCE_EXHAUSTED, EXHAUSTED)
        listed = s.sessions.ListSessions(session_pb2.ListSessionsRequest()).sessions
        assert sorted(x.user for x in listed) == sorted([a.user, b.user])  # one each, still
        run_as = run(s, b.session_id, "id", "-u").stdout.decode().strip()
        assert f"{run_as}:{run_as}" == b.user  # adopted or resumed, as its own uid
        _delete(s, a.session_id)
        c = _default_session(s)
        assert c.user == a.user
        assert run(s, c.session_id, "id", "-u").stdout.decode().strip() == a.user.split(":")[0]
        s.channel.close()
    finally:
        srv.stop()
        remove_owned_containers(owner)


def test_a_block_holding_a_reserved_id_stops_the_server(tmp_path: Path) -> None:
    """The keeper's uid (65533 by default) and nobody in the block: the server does not start."""
    with pytest.raises(RuntimeError, match="keeper"):
        start_server(
            tmp_path / "data",
            "hidc" + secrets.token_hex(4),
            "--host-uid-first",
            "60000",
            "--host-uid-count",
            "10000",
        )


def _default_session(s: Stubs) -> session_pb2.Session:
    return s.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
    ).session


def test_without_the_agent_commands_run_as_the_sessions_own_uid(tmp_path: Path) -> None:
    """`agent = false`: commands are `docker exec`s as the session's user and the main process
    an idle keeper; each session still runs as (and owns its workspace as) its own uid."""
    owner = "hidn" + secrets.token_hex(4)
    srv = start_server(tmp_path / "data", owner, "--agent", "false")
    try:
        s = make_stubs(srv.address)
        a, b = (_default_session(s) for _ in range(2))
        assert a.user != b.user
        for session in (a, b):
            uid = session.user.partition(":")[0]
            r = run(s, session.session_id, "sh", "-c", "id -u; stat -c %u /workspace")
            assert r.stdout.decode().split() == [uid, uid], r
            assert _watch_error(s, session.session_id) is None
        s.channel.close()
    finally:
        srv.stop()
        remove_owned_containers(owner)
