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
        # A scenario that dies of a signal says where (the SDK's process, not the server's).
        "PYTHONFAULTHANDLER": "1",
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
    "scenario",
    ["create_run", "background", "pty", "files", "async_sdk", "refusals", "pause_resume"],
)
def test_sdk_scenario(door: tuple[ServerProcess, str], sdk: str, scenario: str) -> None:
    srv, url = door
    done = run_scenario(VENVS[sdk], url, scenario)
    assert done.returncode == 0, (
        f"{scenario} with the {sdk} SDK failed:\n{done.stdout}\n{done.stderr}\n"
        f"--- server log ---\n{srv.log()[-6000:]}"
    )


NODE_MODULES = REPO / "build" / "e2b-node" / "node_modules"


def test_node_sdk(door: tuple[ServerProcess, str]) -> None:
    """The npm package, unchanged: create with metadata and env, run, a non-zero exit,
    files, a background command killed, not found after kill."""
    srv, url = door
    if not (NODE_MODULES / "e2b").exists():
        pytest.skip("build/e2b-node is missing (make e2b-sdk)")
    done = subprocess.run(
        ["node", str(SCENARIOS.with_suffix(".mjs"))],
        env={
            "PATH": os.environ.get("PATH", ""),
            "E2B_NODE_MODULES": str(NODE_MODULES),
            "E2B_API_URL": url,
            "E2B_SANDBOX_URL": url,
            "E2B_API_KEY": ALPHA,
        },
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0 and "node scenario ok" in done.stdout, (
        f"{done.stdout}\n{done.stderr}\n--- server log ---\n{srv.log()[-6000:]}"
    )


def test_the_docs_example_runs(door: tuple[ServerProcess, str], tmp_path: Path) -> None:
    """docs/e2b.md's Python example, as printed there, with the current SDK."""
    srv, url = door
    page = (REPO / "docs" / "e2b.md").read_text()
    example = page.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "example.py"
    script.write_text(example)
    python = VENVS["current"] / "bin" / "python"
    if not python.exists():
        pytest.skip("build/e2b-venv is missing (make e2b-sdk)")
    done = subprocess.run(
        [str(python), str(script)],
        env={
            "PATH": os.environ.get("PATH", ""),
            "E2B_API_URL": url,
            "E2B_SANDBOX_URL": url,
            "E2B_API_KEY": ALPHA,
        },
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{srv.log()[-4000:]}"
    assert done.stdout == "hi from /home/user\n\nkept in the workspace\n", done.stdout
