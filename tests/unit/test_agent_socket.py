"""The socket channel's refusals (docs/agent.md, The socket channel; SECURITY.md, The agent's
socket): the agent serves only root from outside its PID namespace (helper/agent_sock.c), the
server connects only into a socket volume of its own, mounted, root's alone
(engine/agent_socket.py), and the container check accepts exactly the socket's bind beside
the wanted ones (engine/docker_profile.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiodocker
import pytest
from agent_pipes import Helper
from agent_wire import HELLO, SYNC, encode_json
from sandboxd.engine.agent_socket import (
    AGENT_SOCKET_DIR,
    SOCKET_NAME,
    VOLUME_PREFIX,
    AgentSockets,
    SocketTransport,
    connect,
)
from sandboxd.engine.docker_attach import DockerAgentPort
from sandboxd.errors import NotFound, Unavailable
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
    except BaseException:
        sock.close()
        raise
    finally:
        os.seteuid(0)
    return sock


def _open_to(directory: Path) -> None:
    """The directory and socket made reachable to anyone, so that only the agent's own check
    of the peer stands between another uid and the channel."""
    os.chmod(directory, 0o711)  # under /tmp: its parents are open already
    os.chmod(directory / SOCKET_NAME, 0o666)


async def _wait_listening(directory: Path) -> None:
    """Until the agent listens on its socket. The file alone is not enough: the agent binds
    it, then sets its mode, then listens; a test's own chmod between the first two would be
    undone. A listening socket has __SO_ACCEPTCON (0x10000) in /proc/net/unix."""
    path = str(directory / SOCKET_NAME)
    for _ in range(250):
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[-1] == path and int(fields[3], 16) & 0x10000:
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


OWNER = "owner1"


@pytest.fixture
def mountpoint() -> Iterator[Path]:
    """A socket volume's mountpoint as the engine's local driver leaves it mounted: a tmpfs
    root of root's, 0700 (`connect` only looks at the directory, not its file system)."""
    path = Path(tempfile.mkdtemp(prefix="sbx-sock-")) / "_data"
    path.mkdir(mode=0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)


def _listening(directory: Path) -> socket.socket:
    """A listener in the agent's place."""
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(directory / SOCKET_NAME))
    sock.listen(4)
    return sock


class _Volumes:
    """The engine's volumes, as aiodocker answers for them."""

    def __init__(self) -> None:
        self.found: dict[str, dict[str, Any]] = {}
        self.in_use: set[str] = set()
        self.filters: list[object] = []

    def show(self, name: str) -> dict[str, Any]:
        if name not in self.found:
            raise aiodocker.DockerError(404, {"message": f"no such volume: {name}"})
        return self.found[name]

    def delete(self, name: str) -> None:
        if name in self.in_use:
            raise aiodocker.DockerError(409, {"message": "volume is in use"})
        if self.found.pop(name, None) is None:
            raise aiodocker.DockerError(404, {"message": f"no such volume: {name}"})

    async def create(self, config: dict[str, Any]) -> None:
        assert config["Name"] not in self.found
        self.found[config["Name"]] = {
            "Name": config["Name"],
            "Driver": config.get("Driver", "local"),
            "Options": config.get("DriverOpts") or {},
            "Labels": config.get("Labels") or {},
            "Mountpoint": f"/var/lib/docker/volumes/{config['Name']}/_data",
            "CreatedAt": "2026-01-01T00:00:00Z",
        }

    async def list(self, filters: dict[str, list[str]]) -> dict[str, Any]:
        self.filters.append(filters)
        wanted = [f.split("=", 1) for f in filters["label"]]
        return {
            "Volumes": [
                v
                for v in self.found.values()
                if all(
                    k in v["Labels"] and (len(kv) == 1 or v["Labels"][k] == kv[1])
                    for kv in wanted
                    for k in kv[:1]
                )
            ]
        }


class _Docker:
    """The engine's API as aiodocker calls it for volumes (inspect and delete by path)."""

    def __init__(self) -> None:
        self.volumes = _Volumes()

    async def _query_json(self, path: str, method: str = "GET", **_: object) -> dict[str, Any]:
        assert method == "GET" and path.startswith("volumes/"), (method, path)
        return self.volumes.show(path.removeprefix("volumes/"))

    @contextlib.asynccontextmanager
    async def _query(self, path: str, method: str = "GET", **_: object) -> AsyncIterator[None]:
        assert method == "DELETE" and path.startswith("volumes/"), (method, path)
        self.volumes.delete(path.removeprefix("volumes/"))
        yield


class _Engine:
    """Enough of the engine for DockerAgentPort's choice of channel."""

    def __init__(self) -> None:
        self.docker = _Docker()

    @contextlib.contextmanager
    def translate(self, what: str) -> Iterator[None]:
        try:
            yield
        except aiodocker.DockerError as exc:
            raise (NotFound if exc.status == 404 else Unavailable)(f"{what}: {exc}") from exc


async def test_the_server_connects_only_into_a_directory_of_its_own_alone(
    mountpoint: Path,
) -> None:
    """A mounted socket volume is root's, 0700. Before the engine mounts it (the container
    not running) its mountpoint is the engine's 0755 directory: refused like any directory
    open to others, where someone could have put a listener in the agent's place."""
    with _listening(mountpoint):
        transport = await connect(mountpoint, "n", wait_s=0)
        await transport.close()
        for mode in (0o755, 0o750, 0o705, 0o770, 0o777, 0o701):
            os.chmod(mountpoint, mode)
            with pytest.raises(PermissionError):
                await connect(mountpoint, "n", wait_s=0)
        os.chmod(mountpoint, 0o700)
        os.chown(mountpoint, NOBODY, NOBODY)  # another uid's
        with pytest.raises(PermissionError):
            await connect(mountpoint, "n", wait_s=0)
        os.chown(mountpoint, 0, 0)
        link = mountpoint.parent / "link"
        link.symlink_to(mountpoint)
        with pytest.raises(OSError):
            await connect(link, "n", wait_s=0)


async def test_a_socket_volume_is_a_small_tmpfs_of_roots_labelled_with_its_owner() -> None:
    engine = _Engine()
    sockets = AgentSockets(OWNER)
    bind = await sockets.prepare(engine.docker, "sandboxd-abc")
    name = AgentSockets.volume_name("sandboxd-abc")
    assert bind == f"{name}:{AGENT_SOCKET_DIR}:rw" and name.startswith(VOLUME_PREFIX)
    info = engine.docker.volumes.found[name]
    assert info["Driver"] == "local"
    assert info["Options"]["type"] == "tmpfs" and info["Options"]["device"] == "tmpfs"
    options = set(info["Options"]["o"].split(","))
    assert {"mode=0700", "uid=0", "gid=0", "noexec", "nosuid", "nodev"} <= options
    assert info["Labels"] == {
        "io.sandboxd.owner": OWNER,
        "io.sandboxd.agent-socket": "sandboxd-abc",
    }
    # A create retried after a failed one finds the volume of the first: a new one replaces it.
    info["Labels"]["stale"] = "yes"
    await sockets.prepare(engine.docker, "sandboxd-abc")
    assert "stale" not in engine.docker.volumes.found[name]["Labels"]
    await sockets.abandon(engine.docker, "sandboxd-abc")
    assert name not in engine.docker.volumes.found


def test_only_a_bind_of_one_of_our_socket_volumes_is_the_socket(tmp_path: Path) -> None:
    ours = f"{AgentSockets.volume_name('n')}:{AGENT_SOCKET_DIR}:rw"
    sockets = AgentSockets(OWNER)
    assert sockets.source_of({"Binds": ["v:/.sandboxd:ro", ours]}) == ours.split(":")[0]
    hexes = "0" * 24
    for bind in (
        f"/tmp:{AGENT_SOCKET_DIR}:rw",  # a host path
        f"{tmp_path}:{AGENT_SOCKET_DIR}:rw",
        f"/var/lib/docker/volumes/{VOLUME_PREFIX}{hexes}/_data:{AGENT_SOCKET_DIR}:rw",
        f"other:{AGENT_SOCKET_DIR}:rw",  # another volume
        f"{VOLUME_PREFIX}{hexes[:23]}:{AGENT_SOCKET_DIR}:rw",  # not our name's shape
        f"{VOLUME_PREFIX}{hexes}0:{AGENT_SOCKET_DIR}:rw",
        f"{VOLUME_PREFIX}{'G' * 24}:{AGENT_SOCKET_DIR}:rw",
        f"{VOLUME_PREFIX}{hexes}:/elsewhere:rw",
        f"{VOLUME_PREFIX}{hexes}:{AGENT_SOCKET_DIR}:ro",
        f"{VOLUME_PREFIX}{hexes}:{AGENT_SOCKET_DIR}",
    ):
        assert sockets.source_of({"Binds": [bind]}) is None, bind
    assert sockets.source_of({}) is None and sockets.source_of({"Binds": None}) is None


async def test_the_port_falls_back_to_the_attach_for_a_volume_not_the_servers(
    mountpoint: Path,
) -> None:
    """The attach, not the socket: a volume not mounted yet (0755), one of another owner, one
    of the local driver that is not a tmpfs (a bind of a host path, whose listener could be
    anyone's), one the engine does not have."""
    engine = _Engine()
    port = DockerAgentPort(engine, OWNER)  # type: ignore[arg-type]
    assert port.sockets is not None
    bind = await port.sockets.prepare(engine.docker, "n")
    name = bind.split(":")[0]
    info = engine.docker.volumes.found[name]
    info["Mountpoint"] = str(mountpoint)
    host: dict[str, object] = {"Binds": [bind]}
    with _listening(mountpoint) as listener:
        os.chmod(mountpoint, 0o755)
        assert "is not the server's alone" in str(await port._socket("c1", host))
        os.chmod(mountpoint, 0o700)
        transport = await port._socket("c2", host)
        assert isinstance(transport, SocketTransport)
        listener.accept()[0].close()
        await transport.close()
        for key, value in (
            ("Labels", {"io.sandboxd.owner": "another", "io.sandboxd.agent-socket": "n"}),
            ("Options", {"type": "none", "device": str(mountpoint), "o": "bind"}),
            ("Driver", "elsewhere"),
        ):
            kept = info[key]
            info[key] = value
            why = await port._socket("c3", host)
            assert why == f"socket: agent socket volume {name} is not one of this server's", key
            info[key] = kept
        del engine.docker.volumes.found[name]
        assert str(await port._socket("c4", host)).startswith("socket: ")


async def test_a_refusal_is_remembered_until_its_container_starts_again(
    mountpoint: Path,
) -> None:
    """An agent that ends two sockets in a row before any answer (its peer check refuses us)
    gets the attach from then on, until its container starts again. One alone is not enough
    (an agent that was stopping ends it too), nor a socket the server closed first (a
    cancelled start, a HELLO that timed out on a loaded host), and an answered socket between
    two unanswered ones starts the count again."""
    engine = _Engine()
    port = DockerAgentPort(engine, OWNER)  # type: ignore[arg-type]
    assert port.sockets is not None
    bind = await port.sockets.prepare(engine.docker, "n")
    engine.docker.volumes.found[bind.split(":")[0]]["Mountpoint"] = str(mountpoint)
    host: dict[str, object] = {"Binds": [bind]}

    async def opened(started: str = "start1") -> SocketTransport:
        transport = await port._socket("c", host, started)
        assert isinstance(transport, SocketTransport), transport
        return transport

    async def unanswered(transport: SocketTransport) -> None:
        listener.accept()[0].close()  # the agent ends it, unanswered
        assert await transport.read() is None and transport.refused
        await transport.close()

    with _listening(mountpoint) as listener:
        ours = await opened()
        listener.accept()[0].close()
        await ours.close()  # closed by the server before an answer
        assert await ours.read() is None and not ours.refused
        await unanswered(await opened())  # a close of ours was no refusal: one
        answered = await opened()  # one alone: the socket again
        peer = listener.accept()[0]
        peer.sendall(b"x")
        assert await answered.read() == b"x"
        peer.close()
        assert await answered.read() is None and not answered.refused
        await answered.close()
        await unanswered(await opened())  # the count began again: one
        await unanswered(await opened())  # two
        assert await port._socket("c", host, "start1") == "its agent ended 2 sockets unanswered"
        assert await port._socket("c", host, "start1") == "its agent ended 2 sockets unanswered"
        again = await opened("start2")  # the container started again
        await again.close()


async def test_the_sweep_removes_only_old_socket_volumes_of_gone_containers_of_its_owner() -> None:
    engine = _Engine()
    mine, theirs = AgentSockets(OWNER), AgentSockets("another")
    for name in ("live", "gone", "young", "busy"):
        await mine.prepare(engine.docker, name)
    await theirs.prepare(engine.docker, "gone-theirs")
    found = engine.docker.volumes.found
    found[AgentSockets.volume_name("young")]["CreatedAt"] = datetime.now(UTC).isoformat()
    engine.docker.volumes.in_use.add(AgentSockets.volume_name("busy"))
    gone = await mine.sweep(engine.docker, ["live"])
    assert gone == [f"agent socket volume {AgentSockets.volume_name('gone')}"]
    assert set(found) == {
        AgentSockets.volume_name(n) for n in ("live", "young", "busy", "gone-theirs")
    }
    assert engine.docker.volumes.filters == [
        {"label": [f"io.sandboxd.owner={OWNER}", "io.sandboxd.agent-socket"]}
    ]


async def test_a_removed_sandbox_takes_its_socket_volume_with_it() -> None:
    engine = _Engine()
    port = DockerAgentPort(engine, OWNER)  # type: ignore[arg-type]
    assert port.sockets is not None
    await port.sockets.prepare(engine.docker, "n")
    port.created("cid", "n")
    await port.forget("cid")
    assert engine.docker.volumes.found == {}
    await port.forget("cid")  # twice: nothing left to remove, no error


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
            agent_socket=True,
            owner_id=OWNER,
        )
        port = engine._agent_port
        assert isinstance(port, DockerAgentPort)
        return port

    unix = EngineAddress(url="unix://localhost", socket_path="/var/run/docker.sock")
    assert port_of(unix).sockets is not None
    tunnel = EngineAddress(url="http://127.0.0.1:2375", local=True)
    assert port_of(tunnel).sockets is None
