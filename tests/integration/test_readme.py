"""The docs' grpcurl walkthrough, run for real against a live server, exactly as a user would
paste it (only the address changes): documentation that drifts from the server fails here.

Walkthrough blocks are found in README.md and every docs/*.md, so moving a block between pages
keeps it under test, and a block name used twice anywhere is an error.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, remove_owned_containers, start_server

README = REPO / "README.md"
DOCS = REPO / "docs"
DEFAULT_ADDRESS = "localhost:50051"

_BLOCK_RE = re.compile(
    r"<!-- walkthrough:start(?: (?P<name>[\w.-]+))? -->\s*\n"
    r"```(?:sh|bash)\n(?P<body>.*?)```\s*\n"
    r"<!-- walkthrough:end(?: (?P<end>[\w.-]+))? -->",
    re.DOTALL,
)
_MARKER_RE = re.compile(r"<!-- walkthrough:(start|end)\b")


def walkthroughs(text: str) -> dict[str, str]:
    """Every marked shell block: name -> script; an unnamed block is called "default".

    A marker that does not frame exactly one ```sh block is an error, so a block cannot
    silently drop out of the test.
    """
    blocks: dict[str, str] = {}
    for m in _BLOCK_RE.finditer(text):
        name = m.group("name") or "default"
        if m.group("end") not in (None, m.group("name")):
            raise ValueError(f"walkthrough {name!r} ends as {m.group('end')!r}")
        if name in blocks:
            raise ValueError(f"two walkthroughs named {name!r}")
        blocks[name] = m.group("body")
    markers = len(_MARKER_RE.findall(text))
    if markers != 2 * len(blocks):
        raise ValueError(
            f"{markers} walkthrough markers but {len(blocks)} well-formed blocks: each start "
            "marker must be followed by one ```sh block and an end marker"
        )
    return blocks


def documented_walkthroughs() -> dict[str, str]:
    """Every walkthrough of README.md and docs/*.md by name; a name in two files is an error."""
    found: dict[str, str] = {}
    where: dict[str, Path] = {}
    for doc in [README, *sorted(DOCS.glob("*.md"))]:
        for name, body in walkthroughs(doc.read_text()).items():
            if name in found:
                raise ValueError(f"walkthrough {name!r} in both {where[name]} and {doc}")
            found[name], where[name] = body, doc
    return found


def test_the_docs_walkthroughs_are_found() -> None:
    assert {"default", "cookbook", "templates"} <= set(documented_walkthroughs())


def test_extractor_finds_named_blocks() -> None:
    text = (
        "intro\n<!-- walkthrough:start -->\n```sh\necho one\n```\n<!-- walkthrough:end -->\n"
        "text\n<!-- walkthrough:start cookbook -->\n```bash\necho two\necho three\n```\n"
        "<!-- walkthrough:end cookbook -->\n"
    )
    assert walkthroughs(text) == {"default": "echo one\n", "cookbook": "echo two\necho three\n"}


@pytest.mark.parametrize(
    "text",
    [
        "<!-- walkthrough:start -->\n```sh\necho\n```\n",  # no end
        "<!-- walkthrough:start a -->\n```sh\necho\n```\n<!-- walkthrough:end b -->\n",
        "<!-- walkthrough:start -->\nnot code\n<!-- walkthrough:end -->\n",
        "<!-- walkthrough:start a -->\n```sh\n```\n<!-- walkthrough:end -->\n"
        "<!-- walkthrough:start a -->\n```sh\n```\n<!-- walkthrough:end -->\n",
    ],
)
def test_extractor_refuses_malformed_markers(text: str) -> None:
    with pytest.raises(ValueError):
        walkthroughs(text)


def run_walkthrough(script: str, address: str, tmp_path: Path) -> list[tuple[float, str]]:
    """Run with bash -euo pipefail; every output line (stdout and stderr) with its arrival time."""
    path = tmp_path / "walkthrough.sh"
    script = script.replace(DEFAULT_ADDRESS, address)
    # Another address of the default port would be someone's `make run`, not this test's server.
    assert ":50051" not in script, f"a walkthrough names an address other than {DEFAULT_ADDRESS}"
    path.write_text(script)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    lines: list[tuple[float, str]] = []
    assert proc.stdout is not None
    with proc.stdout:
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
    code = proc.wait(timeout=120)
    output = "\n".join(text for _, text in lines)
    assert code == 0, f"walkthrough failed ({code}):\n{output}"
    return lines


def _json_objects(output: str) -> list[dict[str, object]]:
    """The JSON messages grpcurl printed, in order (each is a pretty-printed object)."""
    decoder = json.JSONDecoder()
    objects, i = [], 0
    while (start := output.find("{", i)) != -1:
        try:
            obj, end = decoder.raw_decode(output, start)
        except json.JSONDecodeError:
            i = start + 1
            continue
        if isinstance(obj, dict):
            objects.append(obj)
        i = end
    return objects


def test_readme_walkthrough(tmp_path: Path) -> None:
    script = documented_walkthroughs()["default"]
    owner = "readme" + secrets.token_hex(3)
    # A server of its own: the walkthrough's fixed session id "demo" collides with no one.
    server = start_server(tmp_path / "data", owner)
    try:
        lines = run_walkthrough(script, server.address, tmp_path)
    finally:
        server.stop()
        remove_owned_containers(owner)
    output = "\n".join(text for _, text in lines)

    # list: every service, one per line
    listed = {text.strip() for _, text in lines}
    for service in (
        "sandboxd.v1.SessionService",
        "sandboxd.v1.ProcessService",
        "sandboxd.v1.FilesystemService",
        "sandboxd.v1.AdminService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    ):
        assert service in listed, output

    objects = _json_objects(output)
    sessions = [o["session"] for o in objects if "session" in o]
    assert sessions, output
    created = sessions[0]
    assert isinstance(created, dict)
    assert created["session_id"] == "demo"  # grpcurl 1.8 prints proto field names
    assert created["state"] == "SESSION_STATE_RUNNING"
    assert created["labels"] == {"owner": "walkthrough"}

    # Run: the declared file read back ("aGVsbG8K" is "hello\n")
    runs = [o for o in objects if "stdout" in o]
    assert runs and runs[0]["stdout"] == "aGVsbG8K", output
    assert runs[0].get("exit_code", 0) == 0

    # Exec: started, one output event per line, then exited, arriving over time
    events = [o for o in objects if {"started", "output", "exited"} & set(o)]
    kinds = [next(iter({"started", "output", "exited"} & set(o))) for o in events]
    assert kinds == ["started", "output", "output", "output", "exited"], output
    data = [base64.b64decode(str(o["output"]["data"])) for o in events[1:4]]  # type: ignore[index]
    assert data == [b"1\n", b"2\n", b"3\n"]
    arrived = {
        text.split('"')[-2]: at for at, text in lines if '"data": "' in text and '"M' in text
    }
    assert arrived["Mwo="] - arrived["MQo="] > 1.0, "the lines did not stream as produced"

    # WriteFile then ReadFile: "c2hpcCBpdAo=" is "ship it\n"
    assert any(o.get("content") == "c2hpcCBpdAo=" for o in objects), output

    # the refused command: grpcurl prints the code and the ErrorInfo reason
    assert "Code: PermissionDenied" in output
    assert re.search(r'"domain": ?"sandboxd"', output), output
    assert re.search(r'"reason": ?"COMMAND_NOT_ALLOWED"', output), output

    # health at the end
    assert objects[-1] == {"status": "SERVING"}, output
