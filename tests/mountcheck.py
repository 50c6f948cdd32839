"""No sandbox container has a bind mount from the server's file system.

A bind shows a path of the server's host inside the sandbox and cannot exist on a remote engine,
so every container a test's server makes is checked, in every test of the engine layers
(integration/, clients/): volumes (the helper's) and tmpfs are fine, a mount of Type `bind` fails
the test that made it. Two looks, so short-lived containers are not missed:

- a `docker events` watcher (started with the run's first server) inspects each container the
  moment the engine reports its creation;
- after each test body (before its fixtures delete sessions), every container still there.

Which containers: those labelled with the owner id of a server this run started
(`conftest.start_server` records them with `watch_owner`), never another run's (the soak, other
suites on the same engine). `bind_mounts` is also what test_remote_engine.py asks of its own engine.

A runc sandbox's agent socket (`agent_socket = true`, engine/agent_socket.py) is a tmpfs
volume, not a bind: the watch has no exception to make.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sandboxd.labels import LABEL_OWNER

OWNERS: set[str] = set()  # owner ids of the servers this run started
_ENGINE_LAYERS = ("integration", "clients")


def bind_mounts(
    container_ids: Sequence[str], docker: Sequence[str] = ("docker",)
) -> dict[str, list[str]]:
    """Container id -> its bind mounts ("source -> destination"); only containers that have
    any. Containers gone by now are skipped (`docker inspect` names them on stderr)."""
    return {cid: binds for cid, binds in _mounts(container_ids, docker).items() if binds}


def _mounts(container_ids: Sequence[str], docker: Sequence[str]) -> dict[str, list[str]]:
    """Container id -> its bind mounts, for every container that could be inspected."""
    if not container_ids:
        return {}
    fmt = "{{.Id}} {{json .Mounts}}"
    cp = subprocess.run(
        [*docker, "inspect", "--type", "container", "--format", fmt, *container_ids],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found: dict[str, list[str]] = {}
    for line in cp.stdout.splitlines():
        cid, _, mounts = line.partition(" ")
        found[cid] = [
            f"{m.get('Source')} -> {m.get('Destination')}"
            for m in json.loads(mounts or "[]") or []
            if m.get("Type") == "bind"
        ]
    return found


def owned_containers(owners: set[str], docker: Sequence[str] = ("docker",)) -> list[str]:
    """Ids of the containers (running or not) labelled with one of `owners`."""
    if not owners:
        return []
    fmt = '{{.ID}} {{.Label "' + LABEL_OWNER + '"}}'
    cp = subprocess.run(
        [*docker, "ps", "-a", "--no-trunc", "--filter", f"label={LABEL_OWNER}", "--format", fmt],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    ids = []
    for line in cp.stdout.splitlines():
        cid, _, owner = line.partition(" ")
        if owner in owners:
            ids.append(cid)
    return ids


class MountWatch:
    """Inspects each container of `OWNERS` as the engine creates it; keeps what it found."""

    def __init__(self) -> None:
        self.found: dict[str, list[str]] = {}
        self._seen: set[str] = set()  # inspected already
        self._lock = threading.Lock()
        fmt = '{{.ID}} {{index .Actor.Attributes "' + LABEL_OWNER + '"}}'
        # --since now: events from this moment are replayed even if the subscription lags.
        self._proc = subprocess.Popen(
            ["docker", "events", "--since", f"{time.time():.3f}"]
            + ["--filter", "type=container", "--filter", "event=create"]
            + ["--filter", f"label={LABEL_OWNER}", "--format", fmt],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            cid, _, owner = line.strip().partition(" ")
            if owner in OWNERS:
                self.check([cid])

    def check(self, container_ids: Sequence[str]) -> None:
        """Inspect the containers not inspected yet (a container's mounts never change)."""
        with self._lock:
            new = [c for c in container_ids if c not in self._seen]
        inspected = _mounts(new, ("docker",))
        with self._lock:
            self._seen.update(inspected)
            for cid, binds in inspected.items():
                if binds:
                    self.found[cid] = binds

    def take(self) -> dict[str, list[str]]:
        with self._lock:
            found, self.found = self.found, {}
            return found

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(10)
        self._reader.join(5)
        if self._proc.stdout is not None:
            self._proc.stdout.close()


_watch: MountWatch | None = None


def watch_owner(owner_id: str) -> None:
    """Check the containers of a server about to start (the watcher starts with the first)."""
    global _watch
    OWNERS.add(owner_id)
    if _watch is None:
        _watch = MountWatch()


def pytest_sessionfinish() -> None:
    global _watch
    if _watch is not None:
        _watch.close()
        _watch = None


def _in_engine_layer(item: pytest.Item) -> bool:
    return Path(str(item.path)).parent.name in _ENGINE_LAYERS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """After the test body, before its fixtures remove sessions: every container still there."""
    yield
    if _watch is not None and _in_engine_layer(item):
        _watch.check(owned_containers(set(OWNERS)))


@pytest.fixture(autouse=True)
def no_bind_mounts(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test of the engine layers whose server made a container with a bind mount."""
    yield
    found = _watch.take() if _watch is not None and _in_engine_layer(request.node) else {}
    if found:
        lines = [f"{cid[:12]}: {', '.join(binds)}" for cid, binds in sorted(found.items())]
        pytest.fail(
            "a sandbox container has a bind mount from the server's file system:\n"
            + "\n".join(lines),
            pytrace=False,
        )
