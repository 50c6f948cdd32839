"""Run a snippet in a fresh interpreter with only the service on its path: for what one
process's state would hide (modules loaded at start-up, the C heap, malloc arenas)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[1] / "service"


def run_snippet(code: str) -> subprocess.CompletedProcess[str]:
    """`code` (dedented) run by this Python; fails the caller when it exits non-zero."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(SERVICE)},
    )
