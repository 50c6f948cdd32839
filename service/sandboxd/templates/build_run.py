"""A running template build: its log lines, ended at its time limit or at its size limit.

The engine offers no disk limit for a build step (see sandboxd.engine.docker_build), so what
the build has made is measured while it runs, every `watch_every_s`: the largest of its
images and step containers (a `RUN` step's container grows as the step writes; `COPY` writes
into one too). Past the limit the build is ended the way a cancelled one is: its containers
are removed, which ends the running step, and everything carrying its label is pruned. What
the build writes between two measures is the most it can pass the limit by; the image it
finished with is measured once more.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

from sandboxd.errors import ResourceExhausted, SandboxError
from sandboxd.reasons import Reason

WATCH_EVERY_S = 0.25
RECENT_LINES = 20  # log lines kept to tell a step the file size limit stopped
# What a step's log says when the file size limit stopped it: the kernel's EFBIG, the
# shell's SIGXFSZ. (A step could print these itself: it only relabels its own failure.)
_FILE_LIMIT_MESSAGES = ("File too large", "File size limit exceeded")

Measure = Callable[[], Awaitable[int]]  # bytes the build has made so far
Judge = Callable[[int], SandboxError | None]  # the refusal for that size, or None
Abandon = Callable[[], Awaitable[None]]  # end the build's running step, prune what it made


@dataclass(frozen=True)
class SizeLimit:
    """A build's size limit: `cap` (max_image_bytes), `room` (the tenant's quota left) and
    its base's size, which every image it makes includes."""

    room: int
    cap: int
    base_bytes: int

    @property
    def file_bytes(self) -> int:
        """The most one file a RUN step writes may hold (RLIMIT_FSIZE of the step)."""
        return max(1, min(self.room, self.cap) - self.base_bytes)

    def too_large(self, size: int) -> SandboxError | None:
        if size <= self.cap:
            return None
        return ResourceExhausted(
            f"the template's image passed this server's limit of {self.cap} bytes "
            f"(setting max_image_bytes) at {size} bytes; the build was stopped",
            reason=Reason.IMAGE_TOO_LARGE,
            metadata={"limit_bytes": str(self.cap), "size_bytes": str(size)},
        )

    def file_limit_refused(
        self, name: str, over_quota: Callable[[str], SandboxError]
    ) -> SandboxError:
        """A step stopped by the file size limit: the build's size limit, said so."""
        what = f"a step of template {name!r} wrote a file past the {self.file_bytes} bytes left"
        if self.cap > self.room:
            return over_quota(what)
        return ResourceExhausted(
            f"{what} under this server's limit of {self.cap} bytes (setting "
            "max_image_bytes); the build was stopped (its log names the step)",
            reason=Reason.IMAGE_TOO_LARGE,
            metadata={"limit_bytes": str(self.cap)},
        )


def hit_file_limit(lines: Iterable[str]) -> bool:
    """Whether a failed step's last log lines say the file size limit stopped it."""
    return any(m in line for line in lines for m in _FILE_LIMIT_MESSAGES)


async def _watch(measure: Measure, judge: Judge, every_s: float) -> SandboxError:
    """Until the build passes its limit: the refusal to end it with."""
    while True:
        with contextlib.suppress(SandboxError):  # an engine hiccup: measure again next time
            refusal = judge(await measure())
            if refusal is not None:
                return refusal
        await asyncio.sleep(every_s)


async def run(
    lines: AsyncGenerator[str, None],
    *,
    timeout_s: float,
    measure: Measure,
    judge: Judge,
    abandon: Abandon,
    watch_every_s: float = WATCH_EVERY_S,
) -> AsyncIterator[str]:
    """The build's log lines until it ends; ResourceExhausted at the time limit, the size
    limit's refusal when the build passes it.

    Not `asyncio.timeout` around the yields: its cancel would land in the consumer. On expiry
    the running step is ended first, so the engine ends the stream it would otherwise hold
    open until the step finished."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    watch = asyncio.ensure_future(_watch(measure, judge, watch_every_s))
    try:
        async with contextlib.aclosing(lines):
            while True:
                left = max(deadline - loop.time(), 0.001)
                step = asyncio.ensure_future(anext(lines))
                try:
                    done, _ = await asyncio.wait(
                        {step, watch}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                    )
                except BaseException:  # the call was cancelled
                    await _end(step, abandon)
                    raise
                if watch in done:
                    await _end(step, abandon)
                    raise watch.result()
                if not done:
                    await _end(step, abandon)
                    raise ResourceExhausted(
                        f"the build ran longer than {timeout_s:g}s (template_build_timeout_s)",
                        reason=Reason.TEMPLATE_BUILD_TIMEOUT,
                    )
                try:
                    line = step.result()
                except StopAsyncIteration:
                    return
                yield line
    finally:
        watch.cancel()
        with contextlib.suppress(BaseException):
            await watch


async def _end(step: asyncio.Future[str], abandon: Abandon) -> None:
    """End the running step, then the read waiting on its stream (which the engine now
    closes), so the generator is no longer running when it is closed."""
    await asyncio.shield(abandon())
    step.cancel()
    with contextlib.suppress(BaseException):
        await step
