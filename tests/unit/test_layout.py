"""The test tree's own rules: pytest imports test modules by basename (rootdir-relative
`prepend` mode, no packages), so two files of one name in different layers collide at
collection time on a clean checkout."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_names_are_unique_across_layers() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1], "rename one of each pair"


def test_every_test_module_lives_in_a_layer() -> None:
    stray = [p.name for p in TESTS.glob("test_*.py")]
    assert not stray, f"put these in unit/, integration/ or clients/: {stray}"
