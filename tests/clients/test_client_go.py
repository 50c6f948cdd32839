"""The Go client (clients/go), built from Debian's Go packages, against this suite's server.

`make test` installs the packages first (`clients/go/ensure-go.sh`); the committed stubs must
be what `clients/go/gen.sh` generates from proto/.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, ServerProcess

GO_DIR = REPO / "clients" / "go"
PACKAGES = [
    "sandboxd/clients/go/sandboxd",
    "sandboxd/clients/go/sandboxdv1",
    "sandboxd/clients/go/examples/exec",
]


def go(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GO_DIR / "env.sh"), "go", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module", autouse=True)
def _toolchain() -> None:
    missing = [
        t for t in ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc") if not shutil.which(t)
    ]
    assert not missing, f"{missing} missing: run `make go-deps` (Debian packages)"


def test_committed_go_stubs_match_the_protos(tmp_path: Path) -> None:
    subprocess.run([str(GO_DIR / "gen.sh"), str(tmp_path)], check=True, timeout=120)
    committed = GO_DIR / "sandboxdv1"
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(p.name for p in committed.iterdir()), "run clients/go/gen.sh"
    _, mismatch, errors = filecmp.cmpfiles(tmp_path, committed, names, shallow=False)
    assert not mismatch and not errors, f"stale Go stubs {mismatch + errors}: run clients/go/gen.sh"


def test_go_vet_and_gofmt() -> None:
    vet = go("vet", *PACKAGES)
    assert vet.returncode == 0, vet.stderr
    fmt = subprocess.run(["gofmt", "-l", str(GO_DIR)], capture_output=True, text=True, check=True)
    assert fmt.stdout == "", f"gofmt wants to change: {fmt.stdout}"


def test_go_client(server: ServerProcess) -> None:
    result = go("test", "-count=1", "-v", PACKAGES[0], env={"SANDBOXD_ADDR": server.address})
    assert result.returncode == 0, f"go test failed:\n{result.stdout}\n{result.stderr}"
    assert "--- PASS: TestSessionExecAndFiles" in result.stdout
    assert "--- PASS: TestErrorsAreTyped" in result.stdout


def test_go_example_streams_exec(server: ServerProcess) -> None:
    result = go("run", PACKAGES[2], env={"SANDBOXD_ADDR": server.address})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "line 1\nline 2\nline 3\n"
