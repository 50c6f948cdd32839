"""The official `e2b` SDK, unchanged, against sandboxd's E2B door on a live server.

Each scenario of e2b_scenarios.py runs in the SDK's own virtualenv (the current release and
the previous minor one, `make e2b-sdk`), with only E2B_API_URL, E2B_SANDBOX_URL and
E2B_API_KEY set, on a server with two tenants: the second tenant's key must not reach the
first's sandbox.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from authutil import write_tokens
from conftest import REPO, ServerProcess, remove_owned_containers, start_server
from e2butil import base_image_built, door_url

ALPHA, BETA = "e2b-alpha-" + secrets.token_hex(8), "e2b-beta-" + secrets.token_hex(8)
VENVS = {"current": REPO / "build" / "e2b-venv", "previous": REPO / "build" / "e2b-venv-prev"}
SCENARIOS = Path(__file__).with_name("e2b_scenarios.py")


pytestmark = pytest.mark.skipif(
    not base_image_built(), reason="sandboxd-runtime:base not built (make base-image)"
)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    tmp = tmp_path_factory.mktemp("e2b")
    tokens = write_tokens(tmp / "tokens", {ALPHA: "alpha", BETA: "beta"})
    srv = start_server(
        tmp / "data",
        "e2b" + secrets.token_hex(4),
        "--tokens-file",
        str(tokens),
        "--e2b-listen",
        "127.0.0.1:0",
    )
    try:
        yield srv, door_url(srv)
    finally:
        srv.stop()
        remove_owned_containers(srv.owner_id)


def run_scenario(
    venv: Path, url: str, name: str, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{venv} is missing (make e2b-sdk)")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/root"),
        "E2B_API_URL": url,
        "E2B_SANDBOX_URL": url,
        "E2B_API_KEY": ALPHA,
        "E2B_OTHER_API_KEY": BETA,
        "RUN": secrets.token_hex(4),
        **(extra or {}),
    }
    return subprocess.run(
        [str(python), str(SCENARIOS), name],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.mark.parametrize("sdk", sorted(VENVS))
@pytest.mark.parametrize(
    "scenario", ["create_run", "background", "pty", "files", "async_sdk", "refusals"]
)
def test_sdk_scenario(door: tuple[ServerProcess, str], sdk: str, scenario: str) -> None:
    srv, url = door
    done = run_scenario(VENVS[sdk], url, scenario)
    assert done.returncode == 0, (
        f"{scenario} with the {sdk} SDK failed:\n{done.stdout}\n{done.stderr}\n"
        f"--- server log ---\n{srv.log()[-6000:]}"
    )
