"""No hand-written module of the service or its clients grows past what one reader holds at once.

A module over about 450 lines has, in this code base, always been two responsibilities under
one name (the session store and the spelling of its rows; the process manager and the
following of output): cut it where the responsibilities part, not at a line count. The
generated protobuf stubs (`service/sandboxd/v1`, `make proto`) are not read by hand and do
not count; the helper's C files are measured with their own limit (`C_LIMIT`), as one file
per operation or shared piece (helper/README.md). The Python and Node clients' hand-written
sources (`clients/python`, `clients/node`) are held to the service's limit; their generated
files are named in `CLIENT_GENERATED`, and each one named there must say it is generated, so
the list cannot excuse a hand-written file.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT = 460
C_LIMIT = 600
GENERATED = ("service/sandboxd/v1/",)

# The clients' generated files (`make proto`, clients/node/scripts/gen-types.mjs): prefixes.
CLIENT_GENERATED = (
    "clients/python/sandboxd_client/_gen/",
    "clients/node/src/rpc.d.ts",
    "clients/node/src/reasons.js",
    "clients/node/src/reasons.d.ts",
)
CLIENT_SUFFIXES = (".py", ".js", ".mjs", ".cjs", ".ts")
# What each generated file says in its first lines (protoc's, grpc's and this repository's
# generators all do), whatever the case.
GENERATED_MARKER = "do not edit"

# Modules allowed over the limit, each with why; the test fails once one is under it again, so
# that its line goes with the change that cut it. None is excepted today.
KNOWN_LARGE: Mapping[str, str] = {}


def _listed(*paths: str) -> list[str]:
    """The files git tracks or would track under `paths` (never node_modules or build output)."""
    return subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def _lines(path: Path) -> int:
    return len(path.read_text(errors="replace").splitlines())


def _hand_written() -> dict[str, int]:
    names = _listed("service")
    sizes = {}
    for name in names:
        path = REPO / name
        if name.startswith(GENERATED) or path.suffix not in (".py", ".sh") or not path.is_file():
            continue
        sizes[name] = _lines(path)
    return sizes


def _client_sources() -> tuple[dict[str, int], list[str]]:
    """The clients' hand-written sources with their sizes, and the generated files left out."""
    sizes, generated = {}, []
    for name in _listed("clients/python", "clients/node"):
        path = REPO / name
        if not name.endswith(CLIENT_SUFFIXES) or not path.is_file():
            continue
        if name.startswith(CLIENT_GENERATED):
            generated.append(name)
        else:
            sizes[name] = _lines(path)
    return sizes, generated


def test_no_hand_written_module_is_over_the_limit() -> None:
    sizes = _hand_written()
    assert "service/sandboxd/store.py" in sizes  # the listing sees the service's modules
    over = [
        f"{name}: {lines} lines"
        for name, lines in sorted(sizes.items())
        if lines > LIMIT and name not in KNOWN_LARGE
    ]
    assert not over, f"over {LIMIT} lines, cut by responsibility:\n" + "\n".join(over)


def test_every_known_large_module_is_still_large() -> None:
    sizes = _hand_written()
    cut = [name for name in KNOWN_LARGE if sizes.get(name, 0) <= LIMIT]
    assert not cut, f"no longer over {LIMIT} lines, take them out of KNOWN_LARGE: {cut}"


def test_no_helper_source_is_over_its_limit() -> None:
    sources = sorted((REPO / "helper").glob("*.[ch]"))
    assert any(p.name == "sbx.c" for p in sources)  # the listing sees the helper
    over = [
        f"helper/{p.name}: {n} lines"
        for p in sources
        if (n := len(p.read_text(errors="replace").splitlines())) > C_LIMIT
    ]
    assert not over, f"over {C_LIMIT} lines, cut by operation:\n" + "\n".join(over)


def test_no_hand_written_client_source_is_over_the_limit() -> None:
    sizes, _ = _client_sources()
    # the listing sees both clients' hand-written sources
    assert "clients/python/sandboxd_client/session.py" in sizes
    assert "clients/node/src/index.js" in sizes
    over = [f"{name}: {lines} lines" for name, lines in sorted(sizes.items()) if lines > LIMIT]
    assert not over, f"over {LIMIT} lines, cut by responsibility:\n" + "\n".join(over)


def test_every_client_file_left_out_says_it_is_generated() -> None:
    _, generated = _client_sources()
    assert "clients/node/src/rpc.d.ts" in generated  # the list names files that exist
    unmarked = [
        name
        for name in generated
        if GENERATED_MARKER
        not in "\n".join((REPO / name).read_text(errors="replace").splitlines()[:3]).lower()
    ]
    assert not unmarked, f"named generated but not marked so (measure them): {unmarked}"
