"""`sbx watch` (helper/watch.c) on the host: inotify events as JSON lines, confined beneath the
root, renames paired, new directories watched as they appear, nothing lost silently."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

Event = dict[str, Any]


class Watcher:
    def __init__(self, binary: str, root: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [binary, "--root", str(root), "watch", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._pending = b""

    def ready(self) -> None:
        first = self.next(5)
        assert first == {"kind": "ready"}, first

    def next(self, timeout: float) -> Event | None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                return None
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        event: Event = json.loads(line)
        return event

    def collect(self, quiet: float = 0.3, limit: float = 10) -> list[Event]:
        """Every event until none came for `quiet` seconds."""
        got: list[Event] = []
        end = time.monotonic() + limit
        while time.monotonic() < end and (event := self.next(quiet)) is not None:
            got.append(event)
        return got

    def close(self) -> int:
        self.proc.communicate(timeout=5)
        return self.proc.returncode


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    return tmp_path / "ws"


@pytest.fixture
def watch(sbx: str, root: Path):
    made: list[Watcher] = []

    def start(*args: str) -> Watcher:
        made.append(Watcher(sbx, root, *args))
        made[-1].ready()
        return made[-1]

    yield start
    for w in made:
        if w.proc.poll() is None:
            w.proc.kill()
        w.proc.communicate()


def brief(events: list[Event]) -> list[tuple[str, ...]]:
    return [(e["kind"], e["path"], *([e["old_path"]] if "old_path" in e else [])) for e in events]


def test_create_modify_rename_attributes_remove(watch, root: Path) -> None:
    w = watch(".")
    (root / "a.txt").write_text("one")
    time.sleep(0.05)
    with open(root / "a.txt", "a") as f:
        f.write("two")
    os.rename(root / "a.txt", root / "b.txt")
    os.chmod(root / "b.txt", 0o600)
    os.unlink(root / "b.txt")
    events = w.collect()
    assert brief(events) == [
        ("created", "a.txt"),
        ("modified", "a.txt"),
        ("modified", "a.txt"),
        ("renamed", "b.txt", "a.txt"),
        ("attributes", "b.txt"),
        ("removed", "b.txt"),
    ] or brief(events) == [
        ("created", "a.txt"),
        ("modified", "a.txt"),
        ("renamed", "b.txt", "a.txt"),
        ("attributes", "b.txt"),
        ("removed", "b.txt"),
    ]
    assert {e["type"] for e in events[1:]} == {"file"}
    assert w.close() == 0


def test_types_reported(watch, root: Path) -> None:
    w = watch(".")
    (root / "d").mkdir()
    time.sleep(0.05)
    os.symlink("d", root / "link")
    time.sleep(0.05)
    os.rmdir(root / "d")
    events = w.collect()
    assert [(e["kind"], e["path"], e.get("type")) for e in events] == [
        ("created", "d", "dir"),
        ("created", "link", "symlink"),
        ("removed", "d", "dir"),
    ]


def test_helper_write_is_created_then_modified(sbx: str, watch, root: Path) -> None:
    """`sbx write` goes through a temp file renamed over the target: the caller sees the
    target created, then modified, never the temp file."""
    w = watch(".")
    for data in (b"first", b"second"):
        subprocess.run(
            [sbx, "--root", str(root), "write", "f.txt", "644", "100"],
            input=data,
            check=True,
            capture_output=True,
        )
    events = w.collect()
    assert [(e["kind"], e["path"], e["type"]) for e in events] == [
        ("created", "f.txt", "file"),
        ("modified", "f.txt", "file"),
    ]


def test_existing_file_replaced_by_helper_write_is_modified(
    sbx: str,
    watch,
    root: Path,
) -> None:
    (root / "old.txt").write_text("before the watch")
    w = watch(".")
    subprocess.run(
        [sbx, "--root", str(root), "write", "old.txt", "644", "100"],
        input=b"x",
        check=True,
        capture_output=True,
    )
    assert brief(w.collect()) == [("modified", "old.txt")]


def test_moves_in_and_out_of_the_watch(watch, root: Path, tmp_path: Path) -> None:
    (root / "inside").mkdir()
    (tmp_path / "outside.txt").write_text("x")
    (root / "leaving.txt").write_text("x")
    w = watch("inside")
    os.rename(tmp_path / "outside.txt", root / "inside" / "came.txt")
    os.rename(root / "leaving.txt", root / "inside" / "left.txt")
    time.sleep(0.05)
    os.rename(root / "inside" / "left.txt", root / "gone.txt")
    events = w.collect()
    assert brief(events) == [
        ("created", "inside/came.txt"),
        ("created", "inside/left.txt"),
        ("removed", "inside/left.txt"),
    ]
    assert events[-1]["type"] == "file"  # remembered from when it came in


def test_recursive_sees_directories_made_after_the_watch(watch, root: Path) -> None:
    w = watch(".", "--recursive")
    # Created and filled at once: the files may exist before the new directory's watch.
    os.makedirs(root / "a" / "b" / "c")
    (root / "a" / "b" / "c" / "deep.txt").write_text("x")
    (root / "a" / "top.txt").write_text("x")
    time.sleep(0.2)
    (root / "a" / "b" / "c" / "later.txt").write_text("y")
    paths = {(e["kind"], e["path"]) for e in w.collect()}
    for want in ("a", "a/b", "a/b/c", "a/b/c/deep.txt", "a/top.txt", "a/b/c/later.txt"):
        assert ("created", want) in paths, (want, paths)


def test_non_recursive_ignores_nested_changes(watch, root: Path) -> None:
    (root / "sub").mkdir()
    w = watch(".")
    (root / "sub" / "nested.txt").write_text("x")
    (root / "top.txt").write_text("x")
    assert brief(w.collect()) == [("created", "top.txt"), ("modified", "top.txt")]


def test_renamed_directory_keeps_reporting_under_its_new_name(watch, root: Path) -> None:
    (root / "old" / "in").mkdir(parents=True)
    w = watch(".", "--recursive")
    os.rename(root / "old", root / "new")
    time.sleep(0.05)
    (root / "new" / "in" / "f.txt").write_text("x")
    events = brief(w.collect())
    assert events[0] == ("renamed", "new", "old")
    assert ("created", "new/in/f.txt") in events


def test_directory_moved_out_is_no_longer_watched(watch, root: Path, tmp_path: Path) -> None:
    (root / "d").mkdir()
    w = watch(".", "--recursive")
    os.rename(root / "d", tmp_path / "away")
    time.sleep(0.05)
    (tmp_path / "away" / "f.txt").write_text("x")
    assert brief(w.collect()) == [("removed", "d")]


def test_watch_limit_is_an_overflow(watch, root: Path) -> None:
    for name in ("a", "b", "c"):
        (root / name).mkdir()
    w = watch(".", "--recursive", "--max-watches", "2")
    first = w.collect()
    assert [e["kind"] for e in first] == ["overflow"]
    assert first[0]["reason"] == "watches"
    (root / "d").mkdir()
    assert ("overflow", "") in brief(w.collect())


def test_slow_reader_gets_an_overflow_and_later_events(watch, root: Path) -> None:
    w = watch(".", "--queue", "8")
    # Not read meanwhile: the pipe (64 KiB) fills, then the helper's queue of 8.
    for i in range(4000):
        (root / f"file-{i:05d}-with-a-longish-name.txt").write_bytes(b"")
    events = w.collect()
    overflows = [e for e in events if e["kind"] == "overflow"]
    assert overflows and overflows[0]["reason"] in ("queue", "kernel")
    assert len(events) < 4000 + 1
    (root / "after.txt").write_text("x")
    assert ("created", "after.txt") in brief(w.collect())


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("out", "ESCAPE"),
        ("out/sub", "ESCAPE"),
        ("../", "ESCAPE"),
        ("/etc", "ESCAPE"),
        ("missing", "ENOENT"),
        ("file.txt", "ENOTDIR"),
        ("", "EINVAL"),
    ],
)
def test_refused_paths(sbx: str, root: Path, tmp_path: Path, path: str, error: str) -> None:
    (tmp_path / "secret" / "sub").mkdir(parents=True)
    os.symlink(tmp_path / "secret", root / "out")
    (root / "file.txt").write_text("x")
    cp = subprocess.run(
        [sbx, "--root", str(root), "watch", path], capture_output=True, timeout=5, check=False
    )
    assert cp.returncode == 1
    assert cp.stdout == b""
    assert json.loads(cp.stderr)["error"] == error


def test_refused_paths_without_openat2(sbx: str, root: Path, tmp_path: Path) -> None:
    (tmp_path / "secret").mkdir()
    os.symlink(tmp_path / "secret", root / "out")
    cp = subprocess.run(
        [sbx, "--root", str(root), "watch", "out"],
        capture_output=True,
        timeout=5,
        check=False,
        env={**os.environ, "SBX_NO_OPENAT2": "1"},
    )
    assert json.loads(cp.stderr)["error"] == "ESCAPE"


def test_symlink_to_outside_is_never_watched_recursively(watch, root: Path, tmp_path: Path) -> None:
    (tmp_path / "secret").mkdir()
    os.symlink(tmp_path / "secret", root / "out")
    w = watch(".", "--recursive")
    (tmp_path / "secret" / "private.txt").write_text("x")
    assert w.collect() == []


@pytest.mark.parametrize(
    "args", [["--queue", "0"], ["--max-watches", "x"], ["--bogus", "."], [".", "extra"], []]
)
def test_usage_errors(sbx: str, root: Path, args: list[str]) -> None:
    cp = subprocess.run(
        [sbx, "--root", str(root), "watch", *args], capture_output=True, timeout=5, check=False
    )
    assert cp.returncode == 2
    assert json.loads(cp.stderr)["error"] == "EINVAL"


def test_ends_when_stdin_closes(watch) -> None:
    w = watch(".")
    started = time.monotonic()
    assert w.close() == 0
    assert time.monotonic() - started < 2


def test_ends_when_the_watched_directory_goes(watch, root: Path) -> None:
    (root / "d").mkdir()
    w = watch("d")
    os.rmdir(root / "d")
    assert brief(w.collect()) == [("removed", "d")]
    assert w.proc.wait(5) == 0


def _in_one_batch(w: Watcher, *steps: Any) -> None:
    """Run `steps` while the watcher is stopped, so that it reads all their events at once (the
    order the kernel queued them in, none read between two steps)."""
    import signal  # noqa: PLC0415

    w.proc.send_signal(signal.SIGSTOP)
    try:
        for step in steps:
            step()
    finally:
        w.proc.send_signal(signal.SIGCONT)


def test_a_watched_directory_moved_aside_then_deleted_reports_nothing_after_it(
    watch, root: Path
) -> None:
    """Remove takes a tree aside in one rename, then deletes it (helper/remove.c): the watched
    directory is gone with the rename; the deletion of its contents, elsewhere, is not reported
    under its old name after its own removal."""
    import shutil  # noqa: PLC0415

    (root / "d" / "e" / "f").mkdir(parents=True)
    (root / "d" / "e" / "g.txt").write_text("x")
    w = watch("d", "--recursive")
    aside = root / ".sbx-import-rm-1-00000000"
    _in_one_batch(w, lambda: os.rename(root / "d", aside), lambda: shutil.rmtree(aside))
    assert brief(w.collect()) == [("removed", "d")]
    assert w.proc.wait(5) == 0


def test_a_subdirectory_moved_out_then_emptied_is_reported_once(
    watch, root: Path, tmp_path: Path
) -> None:
    """A move out of the tree, its contents then deleted, all read at once: the move's first half
    is settled (removed) before the next event is looked at, whose directory is then no longer
    watched: nothing under the moved name after it (the helper's ASan build checks memory)."""
    import shutil  # noqa: PLC0415

    (root / "w" / "x" / "y").mkdir(parents=True)
    (root / "w" / "x" / "e.txt").write_text("x")
    w = watch("w", "--recursive")
    away = tmp_path / "away"
    _in_one_batch(w, lambda: os.rename(root / "w" / "x", away), lambda: shutil.rmtree(away))
    assert brief(w.collect()) == [("removed", "w/x")]
    assert w.close() == 0
