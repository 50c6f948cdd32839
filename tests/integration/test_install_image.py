"""The server's container image (make image-server: packaging/Dockerfile on the local python
runtime image, no registry), run as an operator would: the engine's socket and a data volume.
It serves a session, and a second container on the same volume still knows that session.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, make_stubs, remove_owned_containers
from installs import first_session
from sandboxd.v1 import session_pb2

BASE = "sandboxd-runtime:python"
SOCKET = "/var/run/docker.sock"


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


pytestmark = pytest.mark.skipif(
    not Path(SOCKET).exists() or _docker("image", "inspect", BASE, check=False).returncode != 0,
    reason=f"needs the engine at {SOCKET} and {BASE} (make python-image)",
)


@pytest.fixture(scope="module")
def server_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    dist = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "PY": sys.executable}
    subprocess.run(
        ["bash", str(REPO / "scripts" / "package-server.sh"), str(dist)],
        check=True,
        capture_output=True,
        timeout=600,
        env=env,
    )
    tag = f"sandboxd-server:t{secrets.token_hex(4)}"
    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-server-image.sh"), tag, str(dist)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert built.returncode == 0, built.stderr
    yield tag
    _docker("rmi", "-f", tag, check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_server(image: str, name: str, volume: str, owner: str, port: int) -> None:
    _docker(
        "run", "-d", "--name", name, "--network", "host",
        "-v", f"{SOCKET}:{SOCKET}", "-v", f"{volume}:/var/lib/sandboxd",
        image, "serve", "--config", "/etc/sandboxd/sandboxd.toml",
        "--listen", f"127.0.0.1:{port}", "--owner-id", owner, "--metrics-listen", "off",
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while "listening on" not in _docker("logs", name, check=False).stderr:
        state = _docker("inspect", "-f", "{{.State.Running}}", name, check=False).stdout.strip()
        assert state == "true", _docker("logs", name, check=False).stderr[-3000:]
        assert time.monotonic() < deadline, _docker("logs", name, check=False).stderr[-3000:]
        time.sleep(0.2)


def test_the_server_image_serves_and_keeps_its_data_on_the_volume(server_image: str) -> None:
    owner = "img" + secrets.token_hex(3)
    volume = f"sandboxd-test-data-{owner}"
    names = [f"sandboxd-test-{owner}-1", f"sandboxd-test-{owner}-2"]
    port = _free_port()
    try:
        _run_server(server_image, names[0], volume, owner, port)
        assert first_session(f"127.0.0.1:{port}") == b"installed\n"
        stubs = make_stubs(f"127.0.0.1:{port}")
        (made,) = stubs.sessions.ListSessions(session_pb2.ListSessionsRequest()).sessions
        stubs.channel.close()
        _docker("stop", "-t", "30", names[0])  # SIGTERM: the graceful stop

        _run_server(server_image, names[1], volume, owner, port)
        stubs = make_stubs(f"127.0.0.1:{port}")
        again = stubs.sessions.GetSession(
            session_pb2.GetSessionRequest(session_id=made.session_id), timeout=30
        ).session
        stubs.channel.close()
        assert again.session_id == made.session_id
    finally:
        for name in names:
            _docker("rm", "-f", name, check=False)
        remove_owned_containers(owner)
        _docker("volume", "rm", "-f", volume, check=False)
