"""The engine tests' one view of a session's containers, through the docker CLI.

A test that checks what the server did to a sandbox (its profile, its processes, that it is
gone) finds the container by the labels the server puts on it (`io.sandboxd.session`, and
`io.sandboxd.owner` for the server that made it, so another test's server sharing the engine
is never in the answer). Ids come whole (`--no-trunc`), which every docker command and the
cgroup paths take.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any


def docker(*args: str) -> str:
    """What `docker ARGS` prints; a failure of the command fails the test."""
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def owned_containers(owner: str) -> list[str]:
    """The ids of every container (stopped ones too) of the server `owner`."""
    return docker("ps", "-aq", "--filter", f"label=io.sandboxd.owner={owner}").split()


def session_containers(
    session_id: str, owner: str | None = None, *, running: bool = False
) -> list[str]:
    """The ids of the session's containers, stopped ones too unless `running`, of the server
    `owner` when it is given."""
    filters = ["--filter", f"label=io.sandboxd.session={session_id}"]
    if owner is not None:
        filters += ["--filter", f"label=io.sandboxd.owner={owner}"]
    return docker("ps", "-q", "--no-trunc", *([] if running else ["-a"]), *filters).split()


def session_container(session_id: str, owner: str | None = None, *, running: bool = False) -> str:
    """The session's one container: none or more than one fails the test."""
    ids = session_containers(session_id, owner, running=running)
    assert len(ids) == 1, f"session {session_id}: containers {ids}"
    return ids[0]


def inspect_container(container: str) -> dict[str, Any]:
    """The engine's whole description of a container (`docker inspect`)."""
    doc: dict[str, Any] = json.loads(docker("inspect", container))[0]
    return doc


# The servers the tests start take the agent's socket channel as the server does by default
# (`agent_socket`, root only), unless SANDBOXD_AGENT_SOCKET=false in the tests' environment.
SOCKET_CHANNEL = os.geteuid() == 0 and os.environ.get("SANDBOXD_AGENT_SOCKET", "").lower() not in (
    "0",
    "false",
    "no",
    "off",
)
SOCKET_DIR = "/run/sbx-agent"


def agent_cmd(user: str, tier: str = "runc") -> list[str]:
    """The agent's command line in a session's container: with the socket channel
    (`agent_socket`, see SOCKET_CHANNEL) a runc agent also listens on its socket; gVisor's
    channel is the attach."""
    tail = (
        ["--channel-socket", f"{SOCKET_DIR}/agent.sock"]
        if SOCKET_CHANNEL and tier == "runc"
        else []
    )
    return ["/.sandboxd/sbx", "agent", "--user", user, *tail]
