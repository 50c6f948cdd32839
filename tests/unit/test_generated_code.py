"""The committed stubs must be exactly what `make proto` generates from proto/."""

from __future__ import annotations

import filecmp
from pathlib import Path

from sandboxd.tools.genproto import REPO, generate


def test_committed_stubs_match_the_protos(tmp_path: Path) -> None:
    generate(tmp_path)
    fresh = tmp_path / "sandboxd" / "v1"
    committed = REPO / "service" / "sandboxd" / "v1"
    fresh_names = sorted(p.name for p in fresh.iterdir() if p.is_file())
    committed_names = sorted(
        p.name for p in committed.iterdir() if p.is_file() and p.suffix in (".py", ".pyi")
    )
    assert fresh_names == committed_names, "run `make proto` and commit the result"
    _, mismatch, errors = filecmp.cmpfiles(fresh, committed, fresh_names, shallow=False)
    assert not mismatch and not errors, f"stale stubs {mismatch + errors}: run `make proto`"
