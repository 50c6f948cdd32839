"""sandboxd-client as a user installs it: the wheel, in a fresh virtualenv outside the repo.

The wheel is built from a copy of clients/python, installed with its dependencies (from the
pip cache or PyPI) into a virtualenv under a temporary folder, and the README's Python
quickstart runs there in isolated mode against a live server: nothing of the repo (not the
server package, not the sources) is importable.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ServerProcess

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "clients" / "python"


def quickstart() -> str:
    readme = (REPO / "README.md").read_text()
    marker = readme.index("<!-- quickstart-python")
    match = re.search(r"```python\n(.*?)```", readme[marker:], re.S)
    assert match is not None, "the README's Python quickstart is gone"
    return match.group(1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src") / "python"
    shutil.copytree(CLIENT, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out, src],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("sandboxd_client-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("venv")
    assert REPO not in root.parents
    subprocess.run([sys.executable, "-m", "venv", root], check=True, timeout=120)
    pip = [
        str(root / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
    ]
    subprocess.run([*pip, str(wheel)], check=True, timeout=600, cwd=root, env=_clean_env())
    yield root


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return {**env, **extra}


def test_the_wheel_carries_stubs_types_and_no_server(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "sandboxd_client/py.typed" in names
    assert "sandboxd_client/_gen/sandboxd/v1/session_pb2.py" in names
    assert "sandboxd_client/_gen/sandboxd/v1/session_pb2.pyi" in names
    assert not [n for n in names if n.startswith("sandboxd/")]
    (meta,) = [n for n in names if n.endswith("METADATA")]
    requires = [
        line.split(":", 1)[1].strip()
        for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert requires and not [r for r in requires if r.startswith("sandboxd")]
    assert all(">=" in r and "<" in r for r in requires), requires  # ranges, not pins


def test_readme_quickstart_runs_from_the_installed_wheel(
    venv: Path, server: ServerProcess, tmp_path: Path
) -> None:
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart())
    python = str(venv / "bin" / "python")
    env = _clean_env(SANDBOXD_ADDR=server.address)
    no_server = subprocess.run(
        [python, "-I", "-c", "import sandboxd"], capture_output=True, cwd=tmp_path, env=env
    )
    assert no_server.returncode != 0, "the server package must not be importable"
    done = subprocess.run(
        [python, "-I", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("server ") and " api v1 " in lines[0]
    assert "stdout b'hi\\n'" in lines and "exit 3" in lines
    assert "refused COMMAND_NOT_ALLOWED retryable False" in lines

    ctl = subprocess.run(
        [str(venv / "bin" / "sandboxctl"), "-o", "json", "info"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert ctl.returncode == 0 and '"api_version": "v1"' in ctl.stdout, ctl.stderr


def test_the_installed_package_type_checks_for_a_consumer(venv: Path, tmp_path: Path) -> None:
    """py.typed is honoured: mypy --strict over the quickstart against the installed wheel."""
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent))
    assert mypy is not None
    script = tmp_path / "consumer.py"
    script.write_text(quickstart())
    site = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    done = subprocess.run(
        [
            mypy,
            "--strict",
            "--no-incremental",
            f"--python-executable={venv / 'bin' / 'python'}",
            str(script),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(MYPYPATH=""),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + site


def test_the_conformance_scenario_runs_from_the_installed_wheel(
    venv: Path, server: ServerProcess, tmp_path: Path
) -> None:
    here = Path(__file__).parent
    runner = tmp_path / "conformance_python.py"  # a copy: nothing is read from the repo
    shutil.copy(here / "conformance_python.py", runner)
    spec = tmp_path / "conformance.json"
    shutil.copy(here / "conformance.json", spec)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-I", str(runner), str(spec)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(SANDBOXD_ADDR=server.address),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [s["id"] for s in json.loads(spec.read_text())["steps"]]
    assert [ln.split()[1] for ln in done.stdout.splitlines()] == steps


def test_the_client_readmes_hello_runs_from_the_installed_wheel(
    venv: Path, server: ServerProcess, tmp_path: Path
) -> None:
    """clients/python/README.md's hello, as written: create, output streamed, a file written
    and read, ./project uploaded, the session deleted at the end of `with`; at most 10 lines."""
    readme = (CLIENT / "README.md").read_text()
    marker = readme.index("<!-- hello-python")
    match = re.search(r"```python\n(.*?)```", readme[marker:], re.S)
    assert match is not None, "the client README's hello is gone"
    hello = match.group(1)
    assert hello == (CLIENT / "examples" / "hello.py").read_text()
    assert len([ln for ln in hello.splitlines() if ln.strip()]) <= 10, hello
    (tmp_path / "hello.py").write_text(hello)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "a.txt").write_text("a\n")
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-I", "hello.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(SANDBOXD_ADDR=server.address),
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello sandbox\nhi\na.txt\n"
