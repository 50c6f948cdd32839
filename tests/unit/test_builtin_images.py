"""Built-in templates' images built by the server: BUILDING, then READY or FAILED, and a create
before then is TEMPLATE_NOT_READY, never a registry pull (sandboxd.templates.builtin_images)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest
from fakes import FakeEngine
from sandboxd.errors import FailedPrecondition
from sandboxd.reasons import Reason
from sandboxd.templates.builtin_images import (
    BuiltinImages,
    RecipeFailed,
    ScriptRunner,
    recipes_dir,
)
from sandboxd.templates.store import TemplateState

PY = "sandboxd-runtime:python"
BB = "sandboxd-runtime:busybox"


class GatedRunner:
    """A recipe that finishes when the test says, adding the image (or failing)."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.gate = asyncio.Event()
        self.calls: list[tuple[str, str]] = []
        self.fail: str | None = None
        self.cancelled = 0

    async def __call__(self, recipe: str, image: str) -> None:
        self.calls.append((recipe, image))
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.gate.clear()
        if self.fail:
            raise RecipeFailed(self.fail)
        self.engine.images[image] = {}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _fixture(
    images: dict[str, str] | None = None,
) -> tuple[FakeEngine, GatedRunner, BuiltinImages, Clock]:
    engine = FakeEngine()
    engine.images.pop(PY, None)
    runner = GatedRunner(engine)
    clock = Clock()
    builtins = BuiltinImages(images or {"python": PY}, engine, runner, clock=clock)
    return engine, runner, builtins, clock


async def test_a_missing_image_is_built_and_not_ready_until_then() -> None:
    engine, runner, builtins, _ = _fixture()
    await builtins.ensure_all()
    status = await builtins.status("python")
    assert status is not None and status.state is TemplateState.BUILDING
    with pytest.raises(FailedPrecondition) as info:
        await builtins.require(PY)
    assert info.value.reason == Reason.TEMPLATE_NOT_READY
    assert info.value.metadata == {"template": "python"}
    assert "being built" in str(info.value)
    await builtins.ensure_all()
    await builtins.require(BB)  # not a built-in this server builds: nothing to say
    await _settle()
    assert runner.calls == [("python.sh", PY)], "one build at a time per template"

    runner.gate.set()
    await _settle()
    assert PY in engine.images
    assert await builtins.status("python") is None  # present: GetTemplate inspects it, READY
    await builtins.require(PY)
    await builtins.close()


async def test_a_failed_build_says_why_and_is_tried_again_on_a_later_use() -> None:
    engine, runner, builtins, clock = _fixture()
    runner.fail = "debootstrap: mirror unreachable"
    await builtins.ensure_all()
    runner.gate.set()
    await _settle()
    status = await builtins.status("python")
    assert status is not None and status.state is TemplateState.FAILED
    assert "mirror unreachable" in status.message
    with pytest.raises(FailedPrecondition) as info:
        await builtins.require(PY)
    assert info.value.reason == Reason.TEMPLATE_NOT_READY
    assert "mirror unreachable" in str(info.value)
    assert len(runner.calls) == 1, "no new build within the retry interval"

    clock.now += 61
    runner.fail = None
    with pytest.raises(FailedPrecondition):  # this use starts the next build
        await builtins.require(PY)
    await _settle()
    assert len(runner.calls) == 2
    status = await builtins.status("python")
    assert status is not None and status.state is TemplateState.BUILDING
    runner.gate.set()
    await _settle()
    await builtins.require(PY)
    await builtins.close()


async def test_an_image_the_operator_named_elsewhere_is_never_built() -> None:
    engine, runner, builtins, _ = _fixture({"python": "python:3.12", "busybox": BB})
    await builtins.ensure_all()
    assert runner.calls == []  # busybox is on the fake engine; python:3.12 is a registry's
    await builtins.require("python:3.12")
    assert await builtins.status("python") is None
    assert builtins.template_of("python:3.12") is None
    await builtins.close()


async def test_shutdown_cancels_a_running_build() -> None:
    _, runner, builtins, _ = _fixture()
    await builtins.ensure_all()
    await _settle()
    await builtins.close()
    assert runner.cancelled == 1
    status = await builtins.status("python")
    assert status is None or status.state is not TemplateState.BUILDING
    await builtins.ensure_all()  # closed: nothing new starts
    assert len(runner.calls) == 1


def _alive(pid: int) -> bool:
    """Running, not merely a zombie its new parent has not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _recipe(tmp_path: Path, name: str, body: str) -> Path:
    (tmp_path / name).write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + body)
    return tmp_path


async def test_the_script_runner_reports_the_last_lines_of_a_failure(tmp_path: Path) -> None:
    recipes = _recipe(tmp_path, "r.sh", 'echo "one"; echo "needs debootstrap" >&2; exit 3\n')
    with pytest.raises(RecipeFailed) as info:
        await ScriptRunner(recipes=recipes)("r.sh", "sandboxd-runtime:x")
    assert "exited 3" in str(info.value) and "needs debootstrap" in str(info.value)


async def test_a_cancelled_script_takes_its_process_group_with_it(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    recipes = _recipe(tmp_path, "r.sh", f"sleep 300 & echo $! > {pids}; echo started; wait\n")
    # An image name of this test's own: the host-wide build lock is per image name, so a
    # build of another run (or another test) never holds this one up.
    image = f"sandboxd-runtime:test-cancel-{os.getpid()}-{id(pids)}"
    task = asyncio.create_task(ScriptRunner(recipes=recipes)("r.sh", image))
    try:
        for _ in range(1500):  # up to 30 s on a loaded host: the recipe starts, then writes
            if pids.exists() and pids.read_text().strip():
                break
            await asyncio.sleep(0.02)
        child = int(pids.read_text())
    finally:
        task.cancel()  # also when the recipe never got going: nothing outlives the test
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(500):  # up to 10 s: a killed process on a loaded host takes a while to go
        if not _alive(child):
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the recipe's child outlived the cancelled build")


def _running_sleeps(mark: str) -> list[int]:
    """The live `sleep MARK` processes of this host."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", mark.encode()] and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


async def test_a_cancel_at_any_moment_of_the_start_leaves_no_recipe_running(
    tmp_path: Path,
) -> None:
    """Cancels landing all through a recipe's start (before the fork, inside the spawn while
    its pipes connect, once it runs): nothing of the recipe is left. A cancel inside the spawn
    had asyncio kill the group's leader (flock) alone, and the recipe went on."""
    mark = str(800000 + os.getpid() % 100000)
    recipes = _recipe(tmp_path, "r.sh", f"sleep {mark} & wait\n")
    try:
        for n in range(40):
            image = f"sandboxd-runtime:test-spawn-{os.getpid()}-{n}"
            task = asyncio.create_task(ScriptRunner(recipes=recipes)("r.sh", image))
            await asyncio.sleep(n * 0.0005)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
        await asyncio.sleep(1.5)  # a recipe left running has started its sleep by now
        assert _running_sleeps(mark) == []
    finally:
        for pid in _running_sleeps(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_recipes_are_in_the_package() -> None:
    """A wheel carries them (package data), so an install without the source tree builds too."""
    for recipe in ("busybox.sh", "python.sh", "base.sh"):
        assert (recipes_dir() / recipe).is_file()


async def test_two_servers_on_one_host_build_an_image_one_after_the_other(tmp_path: Path) -> None:
    """The second waits for the first, whose image its recipe then finds (not run twice at once)."""
    log = tmp_path / "log"
    body = f"echo start >> {log}; sleep 0.3; echo end >> {log}\n"
    recipes = _recipe(tmp_path, "r.sh", body)
    image = f"sandboxd-runtime:test-lock-{os.getpid()}-{id(log)}"
    await asyncio.gather(*(ScriptRunner(recipes=recipes)("r.sh", image) for _ in range(2)))
    assert log.read_text().split() == ["start", "end", "start", "end"]
