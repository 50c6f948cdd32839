"""The rooms of service/sandboxd import downward only, and never in a circle.

A room is a top-level module or package of `sandboxd` (`store`, `sessions/`, `api/`, ...).
They stand in three layers: the base (the vocabulary every room speaks: models, errors,
reasons, paging, the configuration and its sections, the pure parsers the configuration's
checks use), the domain (every other room), and the doors (the servicers, the server's
composition, the web and E2B gateways, the generators). A room may import its own layer or a
lower one; no two rooms may import each other, directly or around a circle, and neither may
two modules. Every import counts, at the top of a module, inside a function or under
`TYPE_CHECKING`: an import moved into a function still ties the two rooms together, so
hiding a cycle that way is refused as well. What both sides of a cycle need moves down to a
room both can import.

The graph is read from the source with `ast`, so the test runs nothing of the service.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "service" / "sandboxd"
GENERATED = {"v1"}  # the protobuf stubs (`make proto`), below everything

BASE = frozenset(
    {
        "base64url",
        "digits",
        "config",
        "config_sections",
        "engine_address",
        "errors",
        "isolation",
        "labels",
        "models",
        "paging",
        "reasons",
        "schema",
        "settings",
        "sqlite_file",
        "state_reason",
        "tokens",
        "validation",
    }
)
DOORS = frozenset({"__main__", "api", "e2b", "server", "tools", "web"})
LAYERS = {"base": 0, "domain": 1, "doors": 2}

# Arrows allowed against the rule, each with why and where it goes; the test fails once one is
# gone, so that its line goes with the change that removed it. None stands today.
KNOWN_ARROWS: Mapping[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[1:2] and parts[1] in GENERATED:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, known: Mapping[str, Path]) -> Iterator[tuple[str, int]]:
    """The modules of `sandboxd` that `module` imports (the deepest that exists), with lines."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""])
            else:
                base = node.module or ""
            base = base.rstrip(".")
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name not in (module, "sandboxd"):
                yield name, node.lineno


def _room(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "__init__"


def _layer(room: str) -> str:
    return "base" if room in BASE else "doors" if room in DOORS else "domain"


@functools.cache
def _graph() -> dict[str, dict[str, str]]:
    """module -> {imported module: "path:line"}"""
    known = _modules()
    graph: dict[str, dict[str, str]] = {}
    for module, path in known.items():
        edges = graph.setdefault(module, {})
        for target, line in _imported(module, path, known):
            edges.setdefault(target, f"{path.relative_to(ROOT.parents[1])}:{line}")
    return graph


def _known(source: str, target: str) -> bool:
    rooms = (f"sandboxd.{_room(source)}", f"sandboxd.{_room(target)}")
    return (source, target) in KNOWN_ARROWS or rooms in KNOWN_ARROWS


def _cycles(graph: Mapping[str, Mapping[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, {})))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _described(cycle: list[str], graph: Mapping[str, Mapping[str, str]]) -> str:
    members = set(cycle)
    arrows = [
        f"    {a} -> {b} ({where})"
        for a in cycle
        for b, where in sorted(graph.get(a, {}).items())
        if b in members
    ]
    return " <-> ".join(cycle) + "\n" + "\n".join(arrows)


def test_the_declared_rooms_exist() -> None:
    rooms = {_room(m) for m in _modules()}
    assert (BASE | DOORS) - rooms == set()


def test_no_room_imports_a_room_of_a_higher_layer() -> None:
    upward = []
    for source, edges in _graph().items():
        for target, where in sorted(edges.items()):
            low, high = _layer(_room(source)), _layer(_room(target))
            if LAYERS[high] > LAYERS[low] and not _known(source, target):
                upward.append(f"{where}: {source} ({low}) imports {target} ({high})")
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_no_two_rooms_import_each_other() -> None:
    rooms: dict[str, dict[str, str]] = {}
    for source, edges in _graph().items():
        into = rooms.setdefault(f"sandboxd.{_room(source)}", {})
        for target, where in edges.items():
            if _room(target) != _room(source) and not _known(source, target):
                into.setdefault(f"sandboxd.{_room(target)}", where)
    cycles = _cycles(rooms)
    assert not cycles, "rooms in a cycle:\n" + "\n".join(_described(c, rooms) for c in cycles)


def test_no_two_modules_import_each_other() -> None:
    graph = {
        source: {t: w for t, w in edges.items() if not _known(source, t)}
        for source, edges in _graph().items()
    }
    cycles = _cycles(graph)
    assert not cycles, "modules in a cycle:\n" + "\n".join(_described(c, graph) for c in cycles)


def test_every_known_arrow_is_still_there() -> None:
    graph = _graph()
    arrows = {(s, t) for s, edges in graph.items() for t in edges}
    rooms = {(f"sandboxd.{_room(s)}", f"sandboxd.{_room(t)}") for s, t in arrows}
    gone = [arrow for arrow in KNOWN_ARROWS if arrow not in arrows and arrow not in rooms]
    assert not gone, f"no longer imported, take them out of KNOWN_ARROWS: {gone}"


def test_the_reader_sees_local_and_relative_imports_and_finds_a_cycle(tmp_path: Path) -> None:
    """The reader is not blind: an import inside a function or under TYPE_CHECKING counts,
    a relative one is resolved, and a circle of three is found."""
    package = tmp_path / "sandboxd" / "room"
    package.mkdir(parents=True)
    source = package / "a.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from sandboxd import other\n"
        "def f():\n    from . import b\n    import sandboxd.third.deep\n"
    )
    known = {
        name: tmp_path
        for name in ("sandboxd.room.a", "sandboxd.room.b", "sandboxd.other", "sandboxd.third")
    }
    found = {name for name, _ in _imported("sandboxd.room.a", source, known)}
    assert found == {"sandboxd.other", "sandboxd.room.b", "sandboxd.third"}
    assert _cycles({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}, "d": {"a": ""}}) == [
        ["a", "b", "c"]
    ]
