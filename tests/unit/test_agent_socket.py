"""The socket channel's refusals (docs/agent.md, The socket channel; SECURITY.md, The agent's
socket): the agent serves only root from outside its PID namespace (helper/agent_sock.c), the
server connects only into a directory of its own alone under data_dir/agent-sockets
(engine/agent_socket.py), and the container check accepts exactly the socket's bind beside
the wanted ones (engine/docker_profile.py)."""

from __future__ import annotations

import asyncio
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_pipes import Helper
from agent_wire import HELLO, SYNC, encode_json
from sandboxd.engine.agent_socket import (
    AGENT_SOCKET_DIR,
    SOCKET_NAME,
    AgentSockets,
    SocketTransport,
    connect,
)
from sandboxd.engine.docker_attach import DockerAgentPort
from test_agent_channel_real import _channel, socket_agent

NOBODY = 65534
HELLO_BYTES = SYNC + encode_json(
    HELLO, 0, {"version": 1, "nonce": "0" * 16, "window": 65536, "keepalive_ms": 60000}
)
# A peer that connects, says HELLO and prints how many bytes the agent answered before the end.
PEER = f"""
import select, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
try:
    s.sendall({HELLO_BYTES!r})
except (BrokenPipeError, ConnectionResetError):  # closed already
    print(0)
    sys.exit(0)
got, deadline = b"", time.monotonic() + 3
while time.monotonic() < deadline:
    if select.select([s], [], [], 0.1)[0]:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:  # closed with our HELLO unread
            break
        if not chunk:
            break
        got += chunk
print(len(got))
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent serves root only")


def _answered(sock: socket.socket, wait_s: float = 3.0) -> int:
    """Bytes the agent sends after our HELLO, until it closes or `wait_s` passes."""
    try:
        sock.sendall(HELLO_BYTES)
    except (BrokenPipeError, ConnectionResetError):  # closed already
        return 0
    got = 0
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if select.select([sock], [], [], 0.05)[0]:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += len(chunk)
            if got and wait_s > 0.5:
                return got
    return got


def _connect_as(path: Path, euid: int) -> socket.socket:
    """A connection made with effective uid `euid` (SO_PEERCRED records the connect's)."""
    sock = socket.socket(socket.AF_UNIX)
    os.seteuid(euid)
    try:
        sock.connect(str(path))
    finally:
        os.seteuid(0)
    return sock


def _open_to(directory: Path) -> None:
    """The directory and socket made reachable to anyone, so that only the agent's own check
    of the peer stands between another uid and the channel."""
    for d in (directory.parent.parent, directory.parent, directory):
        os.chmod(d, 0o711)
    os.chmod(directory / SOCKET_NAME, 0o666)


async def _wait_listening(directory: Path) -> None:
    for _ in range(200):
        if (directory / SOCKET_NAME).exists():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the agent never listened")


# ---------------------------------------------------------------- the agent: who may connect


async def test_a_peer_of_another_uid_is_refused(agent_helper: Helper, tmp_path: Path) -> None:
    async with socket_agent(agent_helper, tmp_path) as (_proc, directory):
        await _wait_listening(directory)
        _open_to(directory)
        hostile = _connect_as(directory / SOCKET_NAME, NOBODY)
        with hostile:
            assert await asyncio.to_thread(_answered, hostile) == 0  # closed, unanswered
        # Root from outside is served on the same socket, after the refusal.
        with _connect_as(directory / SOCKET_NAME, 0) as server:
            assert await asyncio.to_thread(_answered, server) > 0


def _agent_pid(outer: int) -> int:
    """The agent under `unshare --fork`: the child of `outer`."""
    for _ in range(200):
        children = Path(f"/proc/{outer}/task/{outer}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.02)
    raise AssertionError("unshare started no agent")


@pytest.fixture
def unshare() -> Iterator[tuple[str, ...]]:
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("needs util-linux's unshare and nsenter")
    yield ("unshare", "--pid", "--fork", "--kill-child")


async def test_a_root_peer_inside_the_sandbox_pid_namespace_is_refused(
    agent_helper: Helper, tmp_path: Path, unshare: tuple[str, ...]
) -> None:
    """As its PID namespace's PID 1 the agent refuses any peer with a pid there (what a root
    process in the sandbox has), root included; the server, outside, is served."""
    async with socket_agent(agent_helper, tmp_path, unshare) as (proc, directory):
        await _wait_listening(directory)
        agent = await asyncio.to_thread(_agent_pid, proc.pid)
        inside = await asyncio.to_thread(
            subprocess.run,
            ["nsenter", "--target", str(agent), "--pid", "--", sys.executable, "-c", PEER,
             str(directory / SOCKET_NAME)],
            capture_output=True,
            text=True,
            timeout=20,
        )  # fmt: skip
        assert inside.returncode == 0, inside.stderr
        assert inside.stdout.strip() == "0"  # closed, unanswered
        channel = await _channel(await connect(directory, "outside"))
        assert channel.hello.pid == 1  # the agent is its namespace's PID 1
        await channel.close()


async def test_a_socket_channel_that_ends_leaves_the_pipes_and_a_newer_one_replaces_it(
    agent_helper: Helper, tmp_path: Path
) -> None:
    """The engine's attach stays usable throughout: once the socket's server goes, the channel
    is stdin and stdout again; a second connection while one is open takes its place."""
    from agent_pipes import PipeTransport

    async with socket_agent(agent_helper, tmp_path) as (proc, directory):
        first = await _channel(await connect(directory, "first"))
        second = await _channel(await connect(directory, "second"))
        for _ in range(100):  # the first one's connection was closed by the agent
            if first.state.name != "READY":
                break
            await asyncio.sleep(0.05)
        assert first.state.name != "READY"
        await second.close()
        await first.close()
        piped = await _channel(PipeTransport(proc))
        assert piped.hello.pid == proc.pid
        await piped.close()


# ---------------------------------------------------------------- the server: where it connects


@pytest.fixture
def data_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sbx-sock-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _listening(directory: Path) -> socket.socket:
    """A listener in the agent's place."""
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(directory / SOCKET_NAME))
    sock.listen(4)
    return sock


async def test_the_server_connects_only_into_a_directory_of_its_own_alone(
    data_dir: Path,
) -> None:
    sockets = AgentSockets(data_dir)
    directory = Path(sockets.prepare("n").split(":")[0])
    assert (os.stat(directory).st_mode & 0o777, os.stat(directory).st_uid) == (0o700, 0)
    with _listening(directory):
        transport = await connect(directory, "n", wait_s=0)
        await transport.close()
        for mode in (0o750, 0o705, 0o770, 0o777, 0o701):
            os.chmod(directory, mode)
            with pytest.raises(PermissionError):
                await connect(directory, "n", wait_s=0)
        os.chmod(directory, 0o700)
        os.chown(directory, NOBODY, NOBODY)  # another uid's: it could have put a listener
        with pytest.raises(PermissionError):
            await connect(directory, "n", wait_s=0)
        os.chown(directory, 0, 0)
        link = data_dir / "agent-sockets" / "link"
        link.symlink_to(directory)
        with pytest.raises(OSError):
            await connect(link, "n", wait_s=0)


def test_only_a_bind_of_a_directory_directly_under_agent_sockets_is_the_socket(
    data_dir: Path,
) -> None:
    sockets = AgentSockets(data_dir)
    ours = sockets.prepare("n")
    assert sockets.source_of({"Binds": ["v:/.sandboxd:ro", ours]}) == Path(ours.split(":")[0])
    root = sockets.root
    for bind in (
        f"/tmp:{AGENT_SOCKET_DIR}:rw",  # outside data_dir
        f"{data_dir}:{AGENT_SOCKET_DIR}:rw",  # data_dir itself
        f"{root}:{AGENT_SOCKET_DIR}:rw",  # every sandbox's directories
        f"{root}/..:{AGENT_SOCKET_DIR}:rw",
        f"{root}/x/..:{AGENT_SOCKET_DIR}:rw",
        f"{root}/x/y:{AGENT_SOCKET_DIR}:rw",
        f"{root}/x:/elsewhere:rw",
        f"{root}/x:{AGENT_SOCKET_DIR}:ro",
    ):
        assert sockets.source_of({"Binds": [bind]}) is None, bind
    assert sockets.source_of({}) is None and sockets.source_of({"Binds": None}) is None


class _Engine:
    """Enough of the engine for DockerAgentPort's choice of channel."""

    def translate(self, what: str) -> object:
        raise AssertionError(what)


async def test_the_port_falls_back_to_the_attach_for_a_directory_not_the_servers_alone(
    data_dir: Path,
) -> None:
    port = DockerAgentPort(_Engine(), data_dir)  # type: ignore[arg-type]
    assert port.sockets is not None
    bind = port.sockets.prepare("n")
    directory = Path(bind.split(":")[0])
    host: dict[str, object] = {"Binds": [bind]}
    with _listening(directory) as listener:
        os.chmod(directory, 0o755)
        assert await port._socket("c1", host) is None  # the attach then
        os.chmod(directory, 0o700)
        transport = await port._socket("c2", host)
        assert isinstance(transport, SocketTransport)
        listener.accept()[0].close()
        await transport.close()
    outside = Path(tempfile.mkdtemp(prefix="sbx-out-"))
    try:
        with _listening(outside):
            assert await port._socket("c3", {"Binds": [f"{outside}:{AGENT_SOCKET_DIR}:rw"]}) is None
    finally:
        shutil.rmtree(outside)


def test_only_an_engine_on_a_unix_socket_of_this_host_gets_the_socket_channel(
    tmp_path: Path,
) -> None:
    """A loopback TCP address may be a tunnel to another host's engine: the bind's path would
    be that host's. Only a unix:// engine is beside the server for certain."""
    from sandboxd.engine.docker import DockerEngine
    from sandboxd.engine_address import EngineAddress

    (tmp_path / "sbx").write_bytes(b"helper")

    def port_of(address: EngineAddress) -> DockerAgentPort:
        engine = DockerEngine(
            helper_path=tmp_path / "sbx",
            keeper_user="65533:65533",
            address=address,
            agent=True,
            agent_sockets=tmp_path,
        )
        port = engine._agent_port
        assert isinstance(port, DockerAgentPort)
        return port

    unix = EngineAddress(url="unix://localhost", socket_path="/var/run/docker.sock")
    assert port_of(unix).sockets is not None
    tunnel = EngineAddress(url="http://127.0.0.1:2375", local=True)
    assert port_of(tunnel).sockets is None
