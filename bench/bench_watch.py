"""A directory watch next to the same watcher run with a raw `docker exec`, in the same rounds.

- `watch_write_to_event`: from a WriteFile call's start to its CREATED event on an open WatchDir
  stream (p50 ms), against a raw `docker exec sh -c 'echo x > /workspace/f'` to the line of
  `sbx watch` running under its own raw `docker exec` in a container of the same profile: the
  same watcher and the same kind of write, without the server in between.
"""

from __future__ import annotations

import time

from sandboxd.profile import HELPER_IN_CONTAINER
from sandboxd.v1 import filesystem_pb2, watch_pb2

from bench.common import BenchContext, Metric, interleave, latency_metric


class _Lines:
    """The raw watcher's stdout, line by line."""

    def __init__(self, stream: object) -> None:
        self.stream = stream
        self.pending = b""

    async def until(self, needle: bytes) -> None:
        while True:
            *lines, self.pending = self.pending.split(b"\n")
            if any(needle in line for line in lines):
                return
            msg = await self.stream.read_out()  # type: ignore[attr-defined]
            if msg is None:
                raise RuntimeError("the raw watcher ended")
            self.pending += msg.data


async def run(ctx: BenchContext) -> dict[str, Metric]:
    async with ctx.session() as session, ctx.raw_container() as cid:
        sid = session.session_id
        call = ctx.stubs.files.WatchDir(watch_pb2.WatchDirRequest(session_id=sid))
        raw_exec = await ctx.docker.containers.container(cid).exec(
            [HELPER_IN_CONTAINER, "watch", "."], stdin=True, user="65534:65534"
        )
        raw = raw_exec.start(detach=False)
        await raw._init()
        try:
            await call.initial_metadata()
            lines = _Lines(raw)
            await lines.until(b'"ready"')
            n = 0

            async def ours() -> float:
                nonlocal n
                n += 1
                name = f"w{n}"
                start = time.perf_counter()
                await ctx.stubs.files.WriteFile(
                    filesystem_pb2.WriteFileRequest(session_id=sid, path=name, content=b"x")
                )
                while (await call.read()).event.path != name:
                    pass
                return (time.perf_counter() - start) * 1000

            async def theirs() -> float:
                nonlocal n
                n += 1
                name = f"w{n}"
                start = time.perf_counter()
                await ctx.raw_exec(cid, ["sh", "-c", f"echo x > /workspace/{name}"])
                await lines.until(f'"{name}"'.encode())
                return (time.perf_counter() - start) * 1000

            ours_ms, raw_ms = await interleave(ctx, ours, theirs)
        finally:
            call.cancel()
            await raw.close()
    return {"watch_write_to_event": latency_metric(ours_ms, raw_ms)}
