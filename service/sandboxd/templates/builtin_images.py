"""The built-in templates' images, built on this machine when the engine lacks them.

A server installed without its source tree (a wheel, the server image) or started with `make
run` alone may reach an engine that has no `sandboxd-runtime:*` image yet. Those images are never
on a registry, so a session asking for one must not fall through to a pull (which answers
"registry docker.io does not answer" on a machine without one): each built-in has a recipe
shipped in the package (`sandboxd/runtime_images/*.sh`, the same scripts `make image` and `make
python-image` run), and the server runs it in the background when the engine answers, and again
on first use after a failure. Until the image is there a create that needs it is
FAILED_PRECONDITION TEMPLATE_NOT_READY (retryable), and GetTemplate/ListTemplates say BUILDING or
FAILED with the build's last words.

Only images of the local `sandboxd-runtime` repository are built: an operator who points a
built-in at another image (a registry's `python:3.12`) gets it pulled as any image is.
Each build is a task this object owns, cancelled (its process group killed) on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import signal
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol

from sandboxd.errors import FailedPrecondition
from sandboxd.reasons import Reason
from sandboxd.templates.store import TemplateState

log = logging.getLogger("sandboxd.builtin_images")

LOCAL_REPOSITORY = "sandboxd-runtime"
# Which recipe builds each built-in template's image (files of sandboxd/runtime_images).
RECIPES = {"busybox": "busybox.sh", "python": "python.sh", "base": "base.sh"}
RETRY_AFTER_S = 60.0  # a failed build is tried again on a use at least this much later
LAST_LINES = 8  # of a failed build's output, kept for its message
STOP_GRACE_S = 5.0  # SIGTERM to SIGKILL of a cancelled build's process group


class ImageProbe(Protocol):
    async def image_exists(self, image: str) -> bool: ...


class RecipeRunner(Protocol):
    async def __call__(self, recipe: str, image: str) -> None:
        """Build `image` with `recipe`; raises RecipeFailed with its reason when it fails."""
        ...


class RecipeFailed(Exception):
    pass


@dataclass(frozen=True)
class BuiltinStatus:
    state: TemplateState
    message: str = ""


def recipes_dir() -> Path:
    """The recipes as installed: beside this package in a checkout, a wheel or the image."""
    return Path(str(resources.files("sandboxd") / "runtime_images"))


class ScriptRunner:
    """Runs a recipe script with bash, off the loop, in a process group of its own."""

    def __init__(self, env: Mapping[str, str] | None = None, recipes: Path | None = None) -> None:
        self._env = dict(os.environ if env is None else env)
        self._recipes = recipes or recipes_dir()

    async def __call__(self, recipe: str, image: str) -> None:
        # Servers sharing a host build each image once: the second waits on the lock, then the
        # recipe's own check finds the image built (its recipe's hash is the image's label).
        digest = hashlib.sha256(image.encode()).hexdigest()[:16]
        lock = Path(tempfile.gettempdir()) / f"sandboxd-recipe-{digest}.lock"
        locked = ["flock", str(lock)] if shutil.which("flock") else []
        spawn = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *locked,
                "bash",
                str(self._recipes / recipe),
                image,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=self._env,
                start_new_session=True,  # a cancel ends debootstrap and docker import with it
            )
        )
        try:
            # Shielded: a cancel inside the spawn (the process forked, its pipes not yet
            # connected) had asyncio kill the group's leader alone, and the recipe ran on.
            proc = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                await _stop(await spawn)
            raise
        last: deque[str] = deque(maxlen=LAST_LINES)
        try:
            assert proc.stdout is not None
            async for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                last.append(line)
                log.info("building %s: %s", image, line)
            code = await proc.wait()
        except asyncio.CancelledError:
            await _stop(proc)
            raise
        if code != 0:
            said = "; ".join(line for line in last if line) or "no output"
            raise RecipeFailed(f"{recipe} exited {code}: {said}"[:400])


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM to the recipe's group, a grace for it to end, then SIGKILL to the group in any
    case: the leader (flock, or bash) ending first says nothing of the rest of its group (a
    recipe's child survived a SIGTERM its leader died of, holding the build lock)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(proc.wait()), STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


class BuiltinImages:
    """Each built-in template's image: present, being built, or failed (with why)."""

    def __init__(
        self,
        images: Mapping[str, str],
        engine: ImageProbe,
        runner: RecipeRunner,
        *,
        clock: Callable[[], float] = time.monotonic,
        retry_after_s: float = RETRY_AFTER_S,
    ) -> None:
        # Built-ins whose image is ours to build (name -> image); the others are pulled.
        self._ours = {
            name: image
            for name, image in images.items()
            if name in RECIPES and image.partition(":")[0] == LOCAL_REPOSITORY
        }
        self._engine = engine
        self._runner = runner
        self._clock = clock
        self._retry_after_s = retry_after_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._failed: dict[str, tuple[float, str]] = {}  # name -> (when, why)
        self._closed = False

    def template_of(self, image: str) -> str | None:
        """The built-in whose image this is, when the server builds it."""
        return next((n for n, i in self._ours.items() if i == image), None)

    async def ensure_all(self) -> None:
        """Start a build of each missing image (the engine answers: at start, after an outage)."""
        for name in self._ours:
            await self._ensure(name)

    async def _ensure(self, name: str) -> bool:
        """True when the image is there; otherwise a build runs (started here if need be)."""
        if name in self._tasks:
            return False
        if await self._engine.image_exists(self._ours[name]):
            self._failed.pop(name, None)
            return True
        failed = self._failed.get(name)
        recent = failed is not None and self._clock() - failed[0] < self._retry_after_s
        if self._closed or recent:
            return False
        self._start(name)
        return False

    def _start(self, name: str) -> None:
        image = self._ours[name]
        log.info("built-in template %s: building %s (its recipe %s)", name, image, RECIPES[name])
        task = asyncio.get_running_loop().create_task(self._build(name, image))
        self._tasks[name] = task

    async def _build(self, name: str, image: str) -> None:
        try:
            await self._runner(RECIPES[name], image)
            if not await self._engine.image_exists(image):
                raise RecipeFailed(f"{RECIPES[name]} finished but the engine has no {image}")
            self._failed.pop(name, None)
            log.info("built-in template %s: %s is ready", name, image)
        except RecipeFailed as exc:
            self._failed[name] = (self._clock(), str(exc))
            log.warning("built-in template %s: the build of %s failed: %s", name, image, exc)
        except Exception as exc:  # the engine, the runner: the template says so, the loop lives
            self._failed[name] = (self._clock(), f"{type(exc).__name__}: {exc}"[:400])
            log.exception("built-in template %s: the build of %s failed", name, image)
        finally:
            self._tasks.pop(name, None)

    async def status(self, name: str) -> BuiltinStatus | None:
        """BUILDING or FAILED while the server owns the image and it is not there; else None
        (present, or not ours: the caller inspects the image as before)."""
        if name not in self._ours:
            return None
        if name in self._tasks:
            return BuiltinStatus(TemplateState.BUILDING, f"building {self._ours[name]}")
        if name in self._failed and not await self._engine.image_exists(self._ours[name]):
            return BuiltinStatus(TemplateState.FAILED, self._failed[name][1])
        return None

    async def require(self, image: str) -> None:
        """Before a create runs `image`: a built-in's image not there yet is TEMPLATE_NOT_READY
        (a build started if none runs), never a pull from a registry."""
        name = self.template_of(image)
        if name is None or await self._ensure(name):
            return
        if name in self._tasks:
            message = f"template {name!r} is being built ({image}); try again shortly"
        else:
            why = self._failed.get(name, (0.0, "the server is shutting down"))[1]
            message = f"template {name!r} is not ready: its build failed: {why}"
        raise FailedPrecondition(
            message, reason=Reason.TEMPLATE_NOT_READY, metadata={"template": name}
        )

    async def close(self) -> None:
        """Shutdown: every build is cancelled and waited for (its processes killed)."""
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
