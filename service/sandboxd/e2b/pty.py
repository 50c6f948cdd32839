"""PTY processes: an Interact call with a terminal, held by the door for E2B's pid.

sandboxd's background processes have no terminal; Interact has one but lives as long as its
call. So the door holds the call in a task of its own (bounded in number per sandbox and in
all), feeds it SendInput, Update (resize) and SendSignal through a bounded queue, and hands its
output to the Start stream and any Connect streams, each through a bounded queue: a reader
that falls behind is dropped (its stream ends with RESOURCE_EXHAUSTED), never the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import duration_pb2

from sandboxd.e2b.backend import Backend, metadata
from sandboxd.e2b.connect import ConnectError, from_rpc_error
from sandboxd.e2b.process_events import end_event
from sandboxd.e2b.wire import b64, to_home
from sandboxd.exec_spec import MAX_PTY_CELLS
from sandboxd.v1 import process_pb2

log = logging.getLogger(__name__)

MAX_PER_SANDBOX = 16
MAX_IN_ALL = 256
CONTROL_QUEUE = 256
READER_QUEUE = 1024
_END = object()


@dataclass
class _Pty:
    sid: str
    pid: int
    argv: list[str]
    cwd: str
    controls: asyncio.Queue[process_pb2.InteractRequest | None] = field(
        default_factory=lambda: asyncio.Queue(CONTROL_QUEUE)
    )
    readers: list[asyncio.Queue[Any]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)

    def publish(self, item: Any) -> None:
        for q in list(self.readers):
            try:
                q.put_nowait(item)
            except asyncio.QueueFull:
                self.readers.remove(q)
                with contextlib.suppress(asyncio.QueueFull):
                    q.get_nowait()
                q.put_nowait(ConnectError("resource_exhausted", "reader fell behind the PTY"))


class Ptys:
    def __init__(self, backend: Backend, timeout_s: float, idle_s: float) -> None:
        self._b = backend
        self._timeout_s = timeout_s
        self._idle_s = idle_s
        self._live: dict[tuple[str, int], _Pty] = {}

    def has(self, sid: str, pid: int) -> bool:
        return (sid, pid) in self._live

    def listed(self, sid: str) -> list[dict[str, Any]]:
        return [
            {
                "pid": p.pid,
                "config": {"cmd": p.argv[0], "args": p.argv[1:], "cwd": to_home(p.cwd)},
            }
            for (s, _), p in self._live.items()
            if s == sid
        ]

    async def start(
        self,
        key: str,
        sid: str,
        pid: int,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        rows: int,
        cols: int,
    ) -> AsyncIterator[dict[str, Any]]:
        # The server's own bound, checked here so that a size protobuf cannot carry (2**32 and
        # more) is a 400, not a stream cut short; 0 is the terminal's default size.
        if not (0 <= rows <= MAX_PTY_CELLS and 0 <= cols <= MAX_PTY_CELLS):
            raise ConnectError(
                "invalid_argument", f"pty.size is at most {MAX_PTY_CELLS} rows and cols"
            )
        if len(self._live) >= MAX_IN_ALL or sum(s == sid for s, _ in self._live) >= MAX_PER_SANDBOX:
            raise ConnectError("resource_exhausted", "too many PTYs are open")
        pty = _Pty(sid, pid, argv, cwd)
        reader: asyncio.Queue[Any] = asyncio.Queue(READER_QUEUE)
        pty.readers.append(reader)
        start = process_pb2.InteractRequest(
            start=process_pb2.InteractStart(
                request=process_pb2.ExecRequest(
                    session_id=sid,
                    argv=argv,
                    cwd=cwd,
                    env={"TERM": "xterm-256color", **env},
                    timeout=duration_pb2.Duration(seconds=int(self._timeout_s)),
                ),
                pty=process_pb2.PtySize(rows=rows or 24, cols=cols or 80),
                idle_timeout=duration_pb2.Duration(seconds=int(self._idle_s)),
            )
        )
        self._live[(sid, pid)] = pty
        pty.task = asyncio.create_task(self._run(key, pty, start), name=f"e2b pty {sid}/{pid}")
        yield {"event": {"start": {"pid": pid}}}
        async for event in _drain(reader):
            yield event

    async def connect(self, sid: str, pid: int) -> AsyncIterator[dict[str, Any]]:
        pty = self._get(sid, pid)
        reader: asyncio.Queue[Any] = asyncio.Queue(READER_QUEUE)
        pty.readers.append(reader)
        yield {"event": {"start": {"pid": pid}}}
        try:
            async for event in _drain(reader):
                yield event
        finally:
            with contextlib.suppress(ValueError):
                pty.readers.remove(reader)

    async def _run(self, key: str, pty: _Pty, start: process_pb2.InteractRequest) -> None:
        async def requests() -> AsyncIterator[process_pb2.InteractRequest]:
            yield start
            # Input and resizes wait for the terminal: a resize sent before it exists would
            # find nothing to resize.
            await pty.started.wait()
            while (item := await pty.controls.get()) is not None:
                yield item

        call = self._b.processes.Interact(requests(), metadata=metadata(key))
        try:
            async for r in call:
                kind = r.WhichOneof("event")
                if kind == "started":
                    pty.started.set()
                elif kind == "output":
                    pty.publish({"event": {"data": {"pty": b64(r.output.data)}}})
                elif kind == "exited":
                    pty.publish(end_event(r.exited))
                elif kind == "keepalive":
                    pty.publish({"event": {"keepalive": {}}})
        except grpc.aio.AioRpcError as exc:
            pty.publish(from_rpc_error(exc))
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            pty.started.set()
            pty.publish(_END)
            self._live.pop((pty.sid, pty.pid), None)
            # The request iterator waits on the queue: the sentinel ends it with the call.
            while True:
                try:
                    pty.controls.put_nowait(None)
                    break
                except asyncio.QueueFull:
                    pty.controls.get_nowait()

    def _get(self, sid: str, pid: int) -> _Pty:
        pty = self._live.get((sid, pid))
        if pty is None:
            raise ConnectError("not_found", f"process with pid {pid} not found")
        return pty

    async def _control(self, sid: str, pid: int, req: process_pb2.InteractRequest) -> None:
        pty = self._get(sid, pid)
        try:
            await asyncio.wait_for(pty.controls.put(req), timeout=10)
        except TimeoutError:
            raise ConnectError("resource_exhausted", "the PTY is not taking input") from None

    async def send(self, sid: str, pid: int, data: bytes) -> None:
        await self._control(
            sid, pid, process_pb2.InteractRequest(stdin=process_pb2.InteractStdin(data=data))
        )

    async def resize(self, sid: str, pid: int, rows: int, cols: int) -> None:
        if not (0 < rows <= MAX_PTY_CELLS and 0 < cols <= MAX_PTY_CELLS):
            raise ConnectError(
                "invalid_argument", f"pty.size needs 1 to {MAX_PTY_CELLS} rows and cols"
            )
        await self._control(
            sid,
            pid,
            process_pb2.InteractRequest(resize=process_pb2.InteractResize(rows=rows, cols=cols)),
        )

    async def signal(self, sid: str, pid: int, name: str) -> None:
        await self._control(
            sid, pid, process_pb2.InteractRequest(signal=process_pb2.InteractSignal(signal=name))
        )

    async def close(self) -> None:
        tasks = [p.task for p in self._live.values() if p.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _drain(reader: asyncio.Queue[Any]) -> AsyncIterator[dict[str, Any]]:
    while True:
        item = await reader.get()
        if item is _END:
            return
        if isinstance(item, ConnectError):
            raise item
        yield item
        if "end" in item.get("event", {}):
            return
