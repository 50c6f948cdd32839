"""The agent channel over its Unix socket (`agent_socket = true`, engine/agent_socket.py) on
the real engine: runc sandboxes' channels go over it, and what a sandbox can do with it
(SECURITY.md, The agent's socket): commands cannot enter its directory, each sandbox has only
its own socket volume mounted (a tmpfs: no host path shows), none can reach another's socket,
the server refuses a directory that is not its own alone and falls back to the attach, and a
sandbox's volume goes with it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    ServerProcess,
    Stubs,
    make_stubs,
    own_server,
    remove_owned_containers,
    run,
    start_server,
)
from sandboxd.engine.agent_socket import VOLUME_PREFIX
from sandboxd.v1 import common_pb2, process_pb2, session_pb2

SOCKET_DIR = "/run/sbx-agent"
_CHANNEL = re.compile(r"agent channel of ([0-9a-f]{12}): (socket|attach)")


@pytest.fixture(scope="module")
def socket_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    owner = "test" + secrets.token_hex(4)
    with own_server(
        tmp_path_factory.mktemp("data"), owner, env={"SANDBOXD_AGENT_SOCKET": "true"}
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def sstubs(socket_server: ServerProcess) -> Iterator[Stubs]:
    stubs = make_stubs(socket_server.address)
    yield stubs
    stubs.channel.close()


@pytest.fixture
def sessions(sstubs: Stubs) -> Iterator[list[session_pb2.Session]]:
    made: list[session_pb2.Session] = []
    yield made
    for s in made:
        sstubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=s.session_id))


def _session(stubs: Stubs, made: list[session_pb2.Session]) -> session_pb2.Session:
    resp = stubs.sessions.CreateSession(
        session_pb2.CreateSessionRequest(shell=common_pb2.ShellPolicy(allow_all=True))
    )
    made.append(resp.session)
    return resp.session


def _container(owner: str, session_id: str) -> dict[str, object]:
    ids = subprocess.run(
        ["docker", "ps", "-q", "--no-trunc", "--filter", f"label=io.sandboxd.owner={owner}",
         "--filter", f"label=io.sandboxd.session={session_id}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert len(ids) == 1, ids
    out = subprocess.run(["docker", "inspect", ids[0]], capture_output=True, text=True, check=True)
    info: dict[str, object] = json.loads(out.stdout)[0]
    return info


def _kinds(srv: ServerProcess) -> dict[str, str]:
    """Container id (12) -> the kind of its latest agent channel, from the server's log."""
    return {m.group(1): m.group(2) for m in _CHANNEL.finditer("".join(srv.log_lines))}


def _volume(info: dict[str, object]) -> dict[str, object]:
    """The socket volume a container binds at SOCKET_DIR, as the engine inspects it."""
    host = info["HostConfig"]
    assert isinstance(host, dict)
    name = next(str(b).split(":")[0] for b in host["Binds"] if f":{SOCKET_DIR}:" in str(b))
    out = subprocess.run(["docker", "volume", "inspect", name], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    volume: dict[str, object] = json.loads(out.stdout)[0]
    return volume


def _volume_exists(name: str) -> bool:
    out = subprocess.run(["docker", "volume", "inspect", name], capture_output=True, check=False)
    return out.returncode == 0


def test_runc_channels_go_over_the_socket(
    socket_server: ServerProcess, sstubs: Stubs, sessions: list[session_pb2.Session]
) -> None:
    s = _session(sstubs, sessions)
    r = run(sstubs, s.session_id, "sh", "-c", "cat; echo err >&2; exit 5", stdin=b"x" * 300_000)
    assert (r.exit_code, len(r.stdout), r.stderr) == (5, 300_000, b"err\n")
    info = _container(socket_server.owner_id, s.session_id)
    cid = str(info["Id"])
    assert _kinds(socket_server).get(cid[:12]) == "socket", socket_server.log()
    config = info["Config"]
    assert isinstance(config, dict)
    assert config["Cmd"][-2:] == ["--channel-socket", f"{SOCKET_DIR}/agent.sock"]
    name = str(info["Name"]).lstrip("/")
    volume = _volume(info)
    assert volume["Name"] == VOLUME_PREFIX + hashlib.sha256(name.encode()).hexdigest()[:24]
    assert volume["Labels"] == {
        "io.sandboxd.owner": socket_server.owner_id,
        "io.sandboxd.agent-socket": name,
    }
    own = Path(str(volume["Mountpoint"]))
    st = os.stat(own)
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
    assert (own / "agent.sock").is_socket()
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    assert any(f" {own} " in m and " - tmpfs " in m for m in mounts), "not a tmpfs"


def test_a_deleted_session_takes_its_socket_volume_and_mount_with_it(
    socket_server: ServerProcess, sstubs: Stubs
) -> None:
    s = _session(sstubs, [])
    volume = _volume(_container(socket_server.owner_id, s.session_id))
    sstubs.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=s.session_id))
    assert not _volume_exists(str(volume["Name"]))
    assert str(volume["Mountpoint"]) not in Path("/proc/self/mountinfo").read_text()


def test_a_resumed_sandbox_takes_the_socket_again(
    socket_server: ServerProcess, sstubs: Stubs, sessions: list[session_pb2.Session]
) -> None:
    """Suspended, its container stops and the engine unmounts the tmpfs; resumed, a fresh one
    is mounted, the agent listens there again and the channel is the socket."""
    s = _session(sstubs, sessions)
    run(sstubs, s.session_id, "sh", "-c", "echo kept > /workspace/k")
    sstubs.sessions.SuspendSession(session_pb2.SuspendSessionRequest(session_id=s.session_id))
    sstubs.sessions.ResumeSession(session_pb2.ResumeSessionRequest(session_id=s.session_id))
    assert run(sstubs, s.session_id, "cat", "/workspace/k").stdout == b"kept\n"
    cid = str(_container(socket_server.owner_id, s.session_id)["Id"])[:12]
    assert _kinds(socket_server).get(cid) == "socket", socket_server.log()


def test_commands_cannot_enter_the_socket_directory_nor_see_another_sandboxes(
    socket_server: ServerProcess, sstubs: Stubs, sessions: list[session_pb2.Session]
) -> None:
    """A command (the session's uid, no capability) finds the directory closed to it; its
    mounts show its own tmpfs only, with no host path; the first sandbox's socket, by its
    mountpoint on the host or by any other path, is not there to connect to from the second."""
    first, second = _session(sstubs, sessions), _session(sstubs, sessions)
    one = _volume(_container(socket_server.owner_id, first.session_id))
    probe = (
        f"ls {SOCKET_DIR} >/dev/null 2>&1 && echo listed; "
        f"test -e {SOCKET_DIR}/agent.sock && echo socket-visible; "
        f"test -e {one['Mountpoint']} && echo first-visible; "
        f"grep -c -e sandboxd-agent- -e {socket_server.data_dir} /proc/self/mountinfo; "
        f"awk '$5 == \"{SOCKET_DIR}\" {{print $4, $9}}' /proc/self/mountinfo"
    )
    r = run(sstubs, second.session_id, "sh", "-c", probe)
    lines = r.stdout.decode().split()
    assert "listed" not in lines and "socket-visible" not in lines and "first-visible" not in lines
    two = _volume(_container(socket_server.owner_id, second.session_id))
    assert two["Name"] != one["Name"]
    assert lines[-2:] == ["/", "tmpfs"], lines  # the root of a tmpfs: no path of the host's
    assert lines[-3] == "0", lines  # nothing names a socket volume or the server's data
    assert run(sstubs, first.session_id, "echo", "still").stdout == b"still\n"


def test_a_restarted_server_takes_the_socket_again_and_refuses_a_directory_opened_to_others(
    tmp_path: Path,
) -> None:
    """A server SIGKILLed and started again takes each sandbox's channel over its socket and
    adopts its background process; once the directory is opened to others (not the server's
    alone: someone could have put a listener there) the next server's channel is the attach,
    and the process is still adopted."""
    owner = "test" + secrets.token_hex(4)
    env = {"SANDBOXD_AGENT_SOCKET": "true"}
    srv = start_server(tmp_path, owner, env=env)
    stubs = make_stubs(srv.address)
    try:
        sid = _session(stubs, [])
        stubs.processes.StartProcess(
            process_pb2.StartProcessRequest(
                session_id=sid.session_id, process_id="bg", argv=["sleep", "120"]
            ),
            timeout=60,
        )
        info = _container(owner, sid.session_id)
        cid = str(info["Id"])[:12]
        assert _kinds(srv).get(cid) == "socket", srv.log()
        directory = str(_volume(info)["Mountpoint"])
        for mode, kind in ((0o700, "socket"), (0o755, "attach")):
            os.chmod(directory, mode)
            srv.stop(signal.SIGKILL)
            stubs.channel.close()
            srv = start_server(tmp_path, owner, env=env)
            stubs = make_stubs(srv.address)
            got = stubs.processes.GetProcess(
                process_pb2.GetProcessRequest(session_id=sid.session_id, process_id="bg"),
                timeout=60,
            ).process
            assert got.state == process_pb2.PROCESS_STATE_RUNNING, got
            assert run(stubs, sid.session_id, "echo", kind).stdout == f"{kind}\n".encode()
            assert _kinds(srv).get(cid) == kind, srv.log()
    finally:
        stubs.channel.close()
        srv.stop()
        remove_owned_containers(owner)
