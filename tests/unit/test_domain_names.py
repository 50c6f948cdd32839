"""Names come from the domain: no issue numbers or work-item names in code, protos or docs.

Readers of the repository (users of the clients, operators, the next engineer) never see the
tracker those numbers point into, so a comment citing a tracker number tells them nothing, and a
proto file named after a work item ("polish", "_ext") says nothing about what it holds."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ISSUE_NUMBER = re.compile(
    r"\b[Ii]ssues? ?#?\d{1,3}\b|\b[Ff]indings? \d{1,3}\.\d"
    # a tracker's number, a review's rounds, waves, items and stops
    r"|(?<![\w&])#\d{1,3}\b|\b(?:[Rr]ound|[Ww]ave|[Ii]tem|[Ss]top) \d{1,2}\b"
)
GENERATED = re.compile(r"(_pb2(_grpc)?\.pyi?|\.pb\.go)$")


def tracked_text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    files = []
    for raw in out:
        name = raw.decode()
        if not name or GENERATED.search(name) or "/vendor/" in name or "node_modules" in name:
            continue
        path = ROOT / name
        if path.is_file() and b"\0" not in path.read_bytes()[:4096]:
            files.append(path)
    return files


def test_no_issue_numbers_in_code_protos_or_docs() -> None:
    found = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if ISSUE_NUMBER.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "issue numbers in the repository:\n" + "\n".join(found)


def test_proto_files_are_named_by_service_or_topic() -> None:
    names = sorted(p.stem for p in (ROOT / "proto" / "sandboxd" / "v1").glob("*.proto"))
    work_items = [n for n in names if re.search(r"polish|_ext$|_v\d|misc|extra", n)]
    assert not work_items, work_items
