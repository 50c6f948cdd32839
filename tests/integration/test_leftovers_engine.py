"""What an older or a dead server left behind is removed at start: the networks of a server
that made one per ALLOWLIST session (only its own by owner label and name, only those no
container uses; one in use goes at the first Sweep after, counted), and the never-started
stand-ins of commits cut short (only its own)."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import IMAGE, make_stubs, start_server
from sandboxd.v1 import admin_pb2


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


def _exists(network: str) -> bool:
    return _docker("network", "inspect", network, check=False).returncode == 0


@pytest.fixture
def made() -> Iterator[list[str]]:
    """Names of the networks and containers a test made, removed afterwards."""
    names: list[str] = []
    yield names
    for name in reversed(names):
        _docker("rm", "-f", name, check=False)
        _docker("network", "rm", name, check=False)


def _network(made: list[str], name: str, labels: dict[str, str]) -> str:
    flags = [f"--label={k}={v}" for k, v in labels.items()]
    _docker("network", "create", "--internal", *flags, name)
    made.append(name)
    return name


def test_own_unused_session_networks_are_removed_at_start(tmp_path: Path, made: list[str]) -> None:
    owner = "netleft" + secrets.token_hex(4)
    other = "netother" + secrets.token_hex(4)
    own = {"io.sandboxd.owner": owner, "io.sandboxd.session": "s1"}
    gone = _network(made, f"sandboxd-net-{owner}-s1", own)
    in_use = _network(made, f"sandboxd-net-{owner}-s2", {**own, "io.sandboxd.session": "s2"})
    theirs = _network(made, f"sandboxd-net-{other}-s1", {"io.sandboxd.owner": other})
    unlabelled = _network(made, f"sandboxd-net-{owner}-s3", {})
    holder = "netholder-" + secrets.token_hex(4)
    _docker("run", "-d", "--name", holder, "--network", in_use, IMAGE, "sleep", "120")
    made.append(holder)

    server = start_server(tmp_path, owner)
    try:
        assert not _exists(gone), server.log()
        assert f"removed leftover network {gone}" in server.log()
        assert _exists(in_use) and _exists(theirs) and _exists(unlabelled)
        stubs = make_stubs(server.address)
        try:
            assert stubs.admin.Sweep(admin_pb2.SweepRequest(), timeout=60).removed_networks == 0
            _docker("rm", "-f", holder)  # the older server's sandbox is gone: its network may go
            swept = stubs.admin.Sweep(admin_pb2.SweepRequest(), timeout=60)
            # Counted by this Sweep, or by the server's periodic one if it came first.
            periodic = "image(s) and 1 network(s) removed" in server.log()
            assert swept.removed_networks == 1 or periodic, server.log()
            assert not _exists(in_use) and _exists(theirs) and _exists(unlabelled)
        finally:
            stubs.channel.close()
    finally:
        server.stop()


def _container_exists(name: str) -> bool:
    return _docker("container", "inspect", name, check=False).returncode == 0


def test_own_commit_stand_ins_left_by_a_dead_server_are_removed_at_start(
    tmp_path: Path, made: list[str]
) -> None:
    owner = "standin" + secrets.token_hex(4)
    other = "standother" + secrets.token_hex(4)
    ours = f"sandboxd-snapshot-{owner}-snap-0123456789abcdef"
    theirs = f"sandboxd-snapshot-{other}-snap-0123456789abcdef"
    for name, of in ((ours, owner), (theirs, other)):
        _docker("create", "--name", name, "--label", f"io.sandboxd.commit-of={of}", IMAGE, "true")
        made.append(name)
    server = start_server(tmp_path, owner)
    try:
        assert not _container_exists(ours), server.log()
        assert f"removed the work container {ours}" in server.log()
        assert _container_exists(theirs)
    finally:
        server.stop()


@pytest.mark.parametrize("work", ["disk-tool", "checkpoint-carrier"])
def test_own_work_containers_left_by_a_dead_server_are_removed_at_start(
    tmp_path: Path, made: list[str], work: str
) -> None:
    """A disk tool run or a checkpoint carrier is created, used and removed within one call: a
    server that died in that call left it, and the next start removes it (only its owner's)."""
    owner = "work" + secrets.token_hex(4)
    other = "workother" + secrets.token_hex(4)
    ours, theirs = f"leftover-{owner}", f"leftover-{other}"
    for name, of in ((ours, owner), (theirs, other)):
        _docker(
            "create", "--name", name,
            "--label", f"io.sandboxd.owner={of}",
            "--label", f"io.sandboxd.work={work}",
            "--label", "io.sandboxd.work-run=0123456789abcdef",
            IMAGE, "true",
        )  # fmt: skip
        made.append(name)
    server = start_server(tmp_path, owner)
    try:
        assert not _container_exists(ours), server.log()
        assert f"removed the work container {ours}" in server.log()
        assert _container_exists(theirs)
    finally:
        server.stop()


def test_a_disk_tool_run_of_an_older_server_is_removed_at_start(
    tmp_path: Path, made: list[str]
) -> None:
    """Tool runs made before work containers had their run label carry only the tool's."""
    owner = "oldtool" + secrets.token_hex(4)
    name = f"leftover-{owner}"
    _docker(
        "create", "--name", name,
        "--label", f"io.sandboxd.owner={owner}",
        "--label", "io.sandboxd.disk-tool=create",
        IMAGE, "true",
    )  # fmt: skip
    made.append(name)
    server = start_server(tmp_path, owner)
    try:
        assert not _container_exists(name), server.log()
    finally:
        server.stop()
