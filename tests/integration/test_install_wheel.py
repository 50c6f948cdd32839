"""The server installed from its wheel into a fresh virtualenv outside the checkout, then
`sandboxd serve --config sandboxd.toml` from an empty folder: it finds the helper the wheel
carries, builds its runtime image on the engine at first start, and runs a session.

The image tag is this test's own, so the build really happens (and is removed after).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, remove_owned_containers
from installs import first_session, outside_repo, serve

WHERE = "import sandboxd; print(sandboxd.__file__)"


def _clean_env(**extra: str) -> dict[str, str]:
    """No trace of this checkout: no PYTHONPATH, no virtualenv, the repo's .venv off PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if not p.startswith(str(REPO)))
    return {**env, **extra}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "PY": sys.executable}
    subprocess.run(
        ["bash", str(REPO / "scripts" / "package-server.sh"), str(out)],
        check=True,
        capture_output=True,
        timeout=600,
        env=env,
    )
    (built,) = out.glob("sandboxd-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("server-venv")
    assert outside_repo(root)
    subprocess.run([sys.executable, "-m", "venv", root], check=True, timeout=120)
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run(
        [*pip, "--disable-pip-version-check", str(wheel)],
        check=True,
        timeout=900,
        cwd=root,
        env=_clean_env(),
    )
    yield root


def test_the_wheel_carries_the_helper_and_the_image_recipes(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        helper = zf.getinfo("sandboxd/bin/sbx")
        assert helper.external_attr >> 16 & 0o111, "the helper must be executable"
    assert {"sandboxd/runtime_images/busybox.sh", "sandboxd/runtime_images/python.sh"} <= names
    assert "sandboxd/v1/session_pb2.py" in names


def test_installed_server_builds_its_image_and_runs_a_session(
    installed: Path, tmp_path: Path
) -> None:
    owner = "whl" + secrets.token_hex(3)
    image = f"sandboxd-runtime:test-whl{secrets.token_hex(4)}"
    site = tmp_path / "site"  # an empty folder: the operator's, with only the config in it
    site.mkdir()
    (site / "sandboxd.toml").write_text(
        f'[server]\nlisten = "127.0.0.1:0"\nowner_id = "{owner}"\n'
        f'[engine]\nimage = "{image}"\n[metrics]\nlisten = "off"\n'
    )
    env = _clean_env()
    where = subprocess.run(
        [str(installed / "bin" / "python"), "-I", "-c", WHERE],
        capture_output=True,
        text=True,
        cwd=site,
        env=env,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(installed), where  # the install, not this checkout
    server = serve(
        [str(installed / "bin" / "sandboxd"), "serve", "--config", "sandboxd.toml"],
        owner,
        site / "data",
        cwd=site,
        env=env,
    )
    try:
        assert first_session(server.address) == b"installed\n", server.log()
        assert (site / "data" / "sessions.db").exists()
    finally:
        server.stop()
        remove_owned_containers(owner)
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)
