"""The helper's path walk for kernels without openat2 (gVisor answers ENOSYS): forced with
SBX_NO_OPENAT2 on this kernel, it must answer every confinement case exactly as openat2 does.
The whole helper suite also passes with the variable set (`SBX_NO_OPENAT2=1 pytest
tests/unit/test_helper.py`)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SBX = REPO / "build" / "sbx"

CASES = [
    ("stat", "out/passwd"),  # absolute symlink out
    ("stat", "d/up/x"),  # relative symlink climbing out
    ("stat", "d/up"),  # the link itself is fine
    ("stat", "in/f"),  # a symlink that stays inside is followed
    ("stat", "in/../f"),  # '..' refused up front
    ("stat", "loop/x"),  # a symlink loop
    ("stat", "d/f/x"),  # through a file
    ("stat", "in/deep/../../f"),
    ("read", "in/f"),
    ("read", "out/passwd"),
    ("read", "d/inner"),  # d/inner -> ../d/f: up then back down, inside
    ("read", "d/far"),  # d/far -> ../../etc/passwd
    ("list", "in"),
    ("mkdir", "in/new"),
    ("mkdir", "out/new"),
]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "f").write_text("hi\n")
    os.symlink("/etc", ws / "out")
    os.symlink("../..", ws / "d" / "up")
    os.symlink("d", ws / "in")
    os.symlink("loop", ws / "loop")
    os.symlink("../d/f", ws / "d" / "inner")
    os.symlink("../../etc/passwd", ws / "d" / "far")
    return ws


def _sbx(root: Path, walk: bool, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SBX_NO_OPENAT2"}
    if walk:
        env["SBX_NO_OPENAT2"] = "1"
    cp = subprocess.run(
        [str(SBX), "--root", str(root), *args], capture_output=True, text=True, env=env, check=False
    )
    return cp.returncode, cp.stdout, cp.stderr


@pytest.mark.skipif(not SBX.exists(), reason="build/sbx not built (make helper)")
@pytest.mark.parametrize(("op", "path"), CASES)
def test_the_walk_answers_like_openat2(tree: Path, op: str, path: str) -> None:
    subprocess.run(["rm", "-rf", str(tree / "d" / "new")], check=False)
    kernel = _sbx(tree, False, op, path)
    subprocess.run(["rm", "-rf", str(tree / "d" / "new")], check=False)
    walked = _sbx(tree, True, op, path)
    assert _no_times(walked) == _no_times(kernel)


def _no_times(result: tuple[int, str, str]) -> tuple[int, str, str]:
    code, out, err = result
    return code, re.sub(r'"mtime_ns":\d+', "", out), err
