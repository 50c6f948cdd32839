"""Every shell block of README.md and docs/*.md is run by the suite, or says why it cannot be.

A block framed by walkthrough markers runs against a live server of its own (blocks with a test
of their own that also checks the output are run there: `DEDICATED`); any other ```sh block must
be preceded by `<!-- not-run: WHY -->` (it needs certificates, a registry or a secrets file the
page only describes), so a new block cannot silently stay untested.
"""

from __future__ import annotations

import re
import secrets
import subprocess
from pathlib import Path

import pytest
from conftest import remove_owned_containers, start_server
from test_readme import DOCS, README, documented_walkthroughs, run_walkthrough, walkthroughs

# Walkthroughs whose own test runs them and checks what they print.
DEDICATED = {
    "default": "test_readme.py",
    "cookbook": "test_readme_cookbook.py",
    "templates": "test_templates.py",
}
_SHELL_BLOCK = re.compile(r"^```(?:sh|bash)\n", re.M)
_NOT_RUN = re.compile(r"<!-- not-run: \S.*? -->\n$")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def unaccounted_blocks(text: str) -> list[int]:
    """Line numbers of shell blocks neither in a walkthrough nor marked not-run."""
    framed = walkthroughs(text)
    out = []
    for m in _SHELL_BLOCK.finditer(text):
        before = text[: m.start()]
        if before.endswith(tuple(f"<!-- walkthrough:start {n} -->\n" for n in framed)):
            continue
        if before.endswith("<!-- walkthrough:start -->\n") or _NOT_RUN.search(before):
            continue
        out.append(before.count("\n") + 1)
    return out


def test_the_inventory_finds_an_unmarked_block() -> None:
    text = (
        "<!-- walkthrough:start a -->\n```sh\necho\n```\n<!-- walkthrough:end a -->\n"
        "<!-- not-run: needs a registry -->\n```sh\necho\n```\n"
        "text\n```sh\necho lost\n```\n"
    )
    assert unaccounted_blocks(text) == [11]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_every_shell_block_is_run_or_says_why_not(page: Path) -> None:
    lines = unaccounted_blocks(page.read_text())
    assert not lines, (
        f"{page.name}: shell blocks at lines {lines} are neither a walkthrough (run by the "
        "suite) nor preceded by <!-- not-run: WHY -->"
    )


def _gvisor() -> bool:
    info = subprocess.run(
        ["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True
    )
    return '"runsc"' in info.stdout


def _generic() -> list[str]:
    return sorted(set(documented_walkthroughs()) - set(DEDICATED))


@pytest.mark.parametrize("name", _generic())
def test_walkthrough_runs(name: str, tmp_path: Path) -> None:
    """The block, pasted as a user would against a fresh server, exits 0 (grpcurl, sandboxctl
    and the clients exit non-zero on any refused call)."""
    script = documented_walkthroughs()[name]
    if "ISOLATION_GVISOR" in script and not _gvisor():
        pytest.skip("the engine has no runsc runtime (make gvisor)")
    owner = "docs" + secrets.token_hex(3)
    server = start_server(tmp_path / "data", owner)
    try:
        run_walkthrough(script, server.address, tmp_path)
    finally:
        server.stop()
        remove_owned_containers(owner)
