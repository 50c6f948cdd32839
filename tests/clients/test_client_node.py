"""The Node client's own tests (`node --test` in clients/node) against this suite's live server.

Dependencies come from the committed package-lock.json (`npm ci`), installed only when the
lock file changed since the last install.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from conftest import REPO, ServerProcess

NODE_DIR = REPO / "clients" / "node"


def ensure_node_deps() -> None:
    """`npm ci` unless node_modules already matches package-lock.json."""
    lock = NODE_DIR / "package-lock.json"
    stamp = NODE_DIR / "node_modules" / ".sandboxd-installed"
    if stamp.exists() and stamp.read_bytes() == lock.read_bytes():
        return
    done = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    stamp.write_bytes(lock.read_bytes())


def test_node_client(server: ServerProcess) -> None:
    assert shutil.which("node") and shutil.which("npm"), "Node 20 and npm are needed"
    ensure_node_deps()
    result = subprocess.run(
        ["node", "--test", "--test-reporter=spec", "test/"],
        cwd=NODE_DIR,
        env={**os.environ, "SANDBOXD_ADDR": server.address},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"node --test failed:\n{result.stdout}\n{result.stderr}"


def test_typescript_declarations() -> None:
    """src/index.d.ts compiles under `tsc --strict` with a typical use of the client."""
    ensure_node_deps()
    result = subprocess.run(
        ["npm", "run", "--silent", "check:types"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"tsc failed:\n{result.stdout}\n{result.stderr}"
