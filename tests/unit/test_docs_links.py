"""The product's docs stand on their own: every link in a committed Markdown file stays inside.

A user reads README, SECURITY.md and docs/ from a checkout or a package; a link to a design note
outside the tree, or to a web page, is a dead end for them (and the outside page may change under
the words that cite it). Addresses in examples (loopback, `example.com`, placeholders) are not
links.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
WEB_ADDRESS = re.compile(r"https?://[^\s)`\"'>]+")
EXAMPLE_HOST = re.compile(
    r"https?://(localhost|127\.0\.0\.1|\[::1\]|host\b|[^/]*example\.(com|org|net)|[<{$])"
)


def _markdown_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO / name for name in listed if "node_modules" not in name and "vendor/" not in name]


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_links_stay_in_the_repository(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    problems: list[str] = []
    for target in MARKDOWN_LINK.findall(text):
        if target.startswith("#") or EXAMPLE_HOST.match(target):
            continue
        if "://" in target or target.startswith("mailto:"):
            problems.append(f"link leaves the repository: {target}")
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(REPO):
            problems.append(f"link leaves the repository: {target}")
        elif not path.exists():
            problems.append(f"link to a file that does not exist: {target}")
    for address in WEB_ADDRESS.findall(text):
        if not EXAMPLE_HOST.match(address):
            problems.append(f"web address outside the repository: {address}")
    if "../shared/" in text:
        problems.append("names a design note outside the repository (../shared/)")
    assert not problems, f"{doc.relative_to(REPO)}: " + "; ".join(problems)
