"""envd's polled watchers (CreateWatcher, GetWatcherEvents, RemoveWatcher), which the SDK's
synchronous `watch_dir` uses: a WatchDir call the door holds, its events kept until polled.

Bounded everywhere: watchers per sandbox and in all, events kept per watcher (past it the next
poll fails with DATA_LOSS, as an overflowing watch does: list the directory again), and a
watcher nobody polls for IDLE_S is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from sandboxd.e2b.backend import Backend
from sandboxd.e2b.connect import ConnectError, from_rpc_error
from sandboxd.e2b.envd_files import FilesystemRpcs
from sandboxd.e2b.wire import text

MAX_PER_SANDBOX = 16
MAX_IN_ALL = 256
MAX_EVENTS = 10_000
IDLE_S = 600.0


@dataclass
class _Watcher:
    sid: str
    events: list[dict[str, Any]] = field(default_factory=list)
    error: ConnectError | None = None
    polled: float = field(default_factory=time.monotonic)
    task: asyncio.Task[None] | None = None


class Watchers:
    def __init__(self, backend: Backend) -> None:
        self._fs = FilesystemRpcs(backend)
        self._live: dict[str, _Watcher] = {}

    def _sweep(self) -> None:
        now = time.monotonic()
        for wid, w in list(self._live.items()):
            if now - w.polled > IDLE_S:
                self._drop(wid)

    def _drop(self, wid: str) -> None:
        w = self._live.pop(wid, None)
        if w is not None and w.task is not None:
            w.task.cancel()

    async def create(self, key: str, sid: str, req: dict[str, Any]) -> dict[str, Any]:
        self._sweep()
        if (
            len(self._live) >= MAX_IN_ALL
            or sum(w.sid == sid for w in self._live.values()) >= MAX_PER_SANDBOX
        ):
            raise ConnectError("resource_exhausted", "too many watchers are open")
        w = _Watcher(sid)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        wid = secrets.token_hex(16)

        async def run() -> None:
            try:
                async for event in self._fs.watch_dir(key, sid, req):
                    if "start" in event:
                        ready.set_result(None)
                    elif len(w.events) >= MAX_EVENTS:
                        w.error = ConnectError("data_loss", "events were lost: list again")
                        return
                    else:
                        w.events.append(event["filesystem"])
            except ConnectError as exc:
                w.error = exc
            except grpc.aio.AioRpcError as exc:
                w.error = from_rpc_error(exc)
            finally:
                if not ready.done():
                    ready.set_result(None)

        text(req, "path")  # checked before anything is started
        w.task = asyncio.create_task(run(), name=f"e2b watcher {sid}")
        await ready
        if w.error is not None:
            raise w.error
        self._live[wid] = w
        return {"watcherId": wid}

    def _get(self, sid: str, req: dict[str, Any]) -> tuple[str, _Watcher]:
        wid = text(req, "watcher_id")
        w = self._live.get(wid)
        if w is None or w.sid != sid:
            raise ConnectError("not_found", f"watcher {wid[:40]!r} not found")
        return wid, w

    async def events(self, key: str, sid: str, req: dict[str, Any]) -> dict[str, Any]:
        wid, w = self._get(sid, req)
        w.polled = time.monotonic()
        events, w.events = w.events, []
        if not events and w.error is not None:
            self._drop(wid)
            raise w.error
        return {"events": events}

    async def remove(self, key: str, sid: str, req: dict[str, Any]) -> dict[str, Any]:
        wid, _ = self._get(sid, req)
        self._drop(wid)
        return {}

    async def close(self) -> None:
        tasks = [w.task for w in self._live.values() if w.task is not None]
        self._live.clear()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
