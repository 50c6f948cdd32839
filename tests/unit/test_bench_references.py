"""The bench's tools name each other's helpers by attribute (`bench_archive._fill_session`); a
rename in one module left bench/profile.py calling functions that no longer existed, found only
when someone profiled. Every `module.name` a bench file reads from another bench module exists."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


def _references(path: Path) -> set[tuple[str, str]]:
    tree = ast.parse(path.read_text())
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "bench":
            for alias in node.names:
                imported[alias.asname or alias.name] = alias.name
    return {
        (imported[node.value.id], node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in imported
    }


@pytest.mark.parametrize("name", MODULES)
def test_every_bench_helper_named_exists(name: str) -> None:
    missing = [
        f"{module}.{attr}"
        for module, attr in sorted(_references(BENCH / f"{name}.py"))
        if not hasattr(importlib.import_module(f"bench.{module}"), attr)
    ]
    assert not missing, f"bench/{name}.py names what is not there: {missing}"
