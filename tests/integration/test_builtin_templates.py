"""A server whose engine lacks a built-in template's image builds it itself, in the background:
BUILDING then READY in GetTemplate/ListTemplates, TEMPLATE_NOT_READY for a create meanwhile
(never a registry error), and a build still running at shutdown is killed with the server.

The real recipe runs against the real engine, under a tag of this test's own; a `docker` shim
first on the server's PATH holds each of the recipe's docker calls until the test opens the
gate, so BUILDING is seen for certain, not by luck of timing.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from conftest import error_info, make_stubs, remove_owned_containers, start_server
from sandboxd.v1 import common_pb2, process_pb2, session_pb2, template_pb2, template_pb2_grpc

T, S = template_pb2, session_pb2
DOCKER = shutil.which("docker")
pytestmark = pytest.mark.skipif(DOCKER is None, reason="the recipes need the docker CLI")


def _gated_docker(tmp: Path) -> tuple[Path, Path]:
    """A PATH folder whose `docker` waits for `tmp/open`, recording its pids in `tmp/pids`."""
    shim = tmp / "shim"
    shim.mkdir()
    (shim / "docker").write_text(
        "#!/bin/sh\n"
        f'echo $$ >> "{tmp}/pids"\n'
        f'while [ ! -e "{tmp}/open" ]; do sleep 0.1; done\n'
        f'exec {DOCKER} "$@"\n'
    )
    (shim / "docker").chmod(0o755)
    return shim, tmp / "open"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _state(tpl: template_pb2_grpc.TemplateServiceStub, name: str) -> int:
    return tpl.GetTemplate(T.GetTemplateRequest(name=name), timeout=10).template.state


def _not_ready(call: object) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    err = info.value
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
    assert error_info(err).reason == "TEMPLATE_NOT_READY", err.details()
    assert "registry" not in (err.details() or "")


def _wait_for_pids(pids: Path) -> list[int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if pids.exists() and pids.read_text().split():
            return [int(p) for p in pids.read_text().split()]
        time.sleep(0.05)
    pytest.fail("the server did not start the recipe")


def test_a_missing_builtin_image_is_built_then_ready(tmp_path: Path) -> None:
    image = f"sandboxd-runtime:test-bb{secrets.token_hex(4)}"
    shim, gate = _gated_docker(tmp_path)
    owner = "bti" + secrets.token_hex(3)
    env = {"PATH": f"{shim}:{os.environ['PATH']}"}
    server = start_server(tmp_path / "data", owner, "--image", image, env=env)
    try:
        stubs = make_stubs(server.address)
        tpl = template_pb2_grpc.TemplateServiceStub(stubs.channel)
        _wait_for_pids(tmp_path / "pids")
        assert _state(tpl, "busybox") == T.TEMPLATE_STATE_BUILDING
        listed = {t.name: t for t in tpl.ListTemplates(T.ListTemplatesRequest()).templates}
        assert listed["busybox"].state == T.TEMPLATE_STATE_BUILDING
        allow = common_pb2.ShellPolicy(allow=["echo"])
        _not_ready(
            lambda: stubs.sessions.CreateSession(
                S.CreateSessionRequest(template="busybox", shell=allow), timeout=30
            )
        )
        # the default image is that built-in's: a create naming nothing waits for it too
        _not_ready(lambda: stubs.sessions.CreateSession(S.CreateSessionRequest(), timeout=30))

        gate.touch()
        deadline = time.monotonic() + 180
        while _state(tpl, "busybox") != T.TEMPLATE_STATE_READY:
            assert time.monotonic() < deadline, "the built-in image was never built"
            time.sleep(0.2)
        created = stubs.sessions.CreateSession(
            S.CreateSessionRequest(template="busybox", shell=allow), timeout=60
        ).session
        out = stubs.processes.Run(
            process_pb2.RunRequest(session_id=created.session_id, argv=["echo", "ready"]),
            timeout=30,
        )
        assert out.stdout == b"ready\n"
        stubs.channel.close()
    finally:
        server.stop()
        remove_owned_containers(owner)
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)


def test_shutdown_kills_a_build_still_running(tmp_path: Path) -> None:
    image = f"sandboxd-runtime:test-bb{secrets.token_hex(4)}"
    shim, _ = _gated_docker(tmp_path)
    owner = "btk" + secrets.token_hex(3)
    env = {"PATH": f"{shim}:{os.environ['PATH']}"}
    server = start_server(tmp_path / "data", owner, "--image", image, env=env)
    try:
        pids = _wait_for_pids(tmp_path / "pids")
    finally:
        server.stop()
        remove_owned_containers(owner)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids):
        assert time.monotonic() < deadline, "the recipe outlived the server"
        time.sleep(0.05)
    assert subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode
