"""The shared conformance scenario (tests/clients/conformance.json) through the Python client.

The runner prints `STEP <id> ok` per passed step; every step of the file must be printed, in
order, so a step the Python client cannot do fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ServerProcess

HERE = Path(__file__).parent
SPEC = HERE / "conformance.json"


def test_every_step_passes_through_the_python_client(server: ServerProcess) -> None:
    steps = [s["id"] for s in json.loads(SPEC.read_text())["steps"]]
    done = subprocess.run(
        [sys.executable, "-I", str(HERE / "conformance_python.py"), str(SPEC)],
        capture_output=True,
        text=True,
        env={**os.environ, "SANDBOXD_ADDR": server.address},
        timeout=300,
    )
    passed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("STEP ")]
    assert passed == steps, done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
