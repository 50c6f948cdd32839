"""The committed stubs must be exactly what `make proto` generates from proto/."""

from __future__ import annotations

import filecmp
from pathlib import Path

from sandboxd.tools.genproto import CLIENT_PACKAGE, generate, generate_client
from sandboxd.tools.paths import REPO


def _same_tree(fresh: Path, committed: Path) -> None:
    fresh_names = sorted(p.name for p in fresh.iterdir() if p.is_file())
    committed_names = sorted(
        p.name for p in committed.iterdir() if p.is_file() and p.suffix in (".py", ".pyi")
    )
    assert fresh_names == committed_names, "run `make proto` and commit the result"
    _, mismatch, errors = filecmp.cmpfiles(fresh, committed, fresh_names, shallow=False)
    assert not mismatch and not errors, f"stale stubs {mismatch + errors}: run `make proto`"


def test_committed_stubs_match_the_protos(tmp_path: Path) -> None:
    generate(tmp_path)
    _same_tree(tmp_path / "sandboxd" / "v1", REPO / "service" / "sandboxd" / "v1")


def test_the_client_packages_stubs_match_the_protos(tmp_path: Path) -> None:
    generate_client(tmp_path)
    for sub in ("_gen", "_gen/sandboxd", "_gen/sandboxd/v1"):
        _same_tree(tmp_path / sub, CLIENT_PACKAGE / sub)


def test_the_client_stubs_never_import_the_server_package() -> None:
    paths = [p for p in (CLIENT_PACKAGE / "_gen").rglob("*") if p.suffix in (".py", ".pyi")]
    assert len(paths) > 20
    for path in paths:
        text = path.read_text()
        assert "from sandboxd.v1" not in text and "import sandboxd.v1" not in text, path
