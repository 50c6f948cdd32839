"""Where the generators find the repository: one place for the paths every tool reads, so
that no generator imports another for them."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PROTO_ROOT = REPO / "proto"
