"""What the audit tests run their producers and edges against (unit/test_audited_rpcs.py,
unit/test_command_records.py): an observer that keeps what is emitted, audit writers that
acknowledge at once or when told, a session of the fake engine with a file to `cat`, and a
real gRPC server on loopback behind the audit interceptor."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
from sandboxd import domain_events as de
from sandboxd.api.audit_interceptor import AuditInterceptor
from sandboxd.audit import AuditEvent
from sandboxd.errors import Unavailable
from sandboxd.models import Session
from sandboxd.sessions import CreateSessionInput
from session_stack import Stack, session_stack

Stub = TypeVar("Stub")


class Recorder:
    def __init__(self) -> None:
        self.events: list[de.DomainEvent] = []

    def emit(self, event: de.DomainEvent) -> None:
        self.events.append(event)


class Writer:
    """The audit writer's two doors; `record` acknowledges after a loop turn, as a commit."""

    def __init__(self) -> None:
        self.acknowledged: list[AuditEvent] = []
        self.queued: list[AuditEvent] = []

    async def record(self, event: AuditEvent) -> AuditEvent:
        await asyncio.sleep(0)
        self.acknowledged.append(event)
        return event

    def record_nowait(self, event: AuditEvent) -> None:
        self.queued.append(event)


class HeldWriter(Writer):
    """Acknowledges only when the test says so (or fails, when told to)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.fail = False

    async def record(self, event: AuditEvent) -> AuditEvent:
        await self.release.wait()
        if self.fail:
            raise Unavailable("the audit log could not be written")
        self.acknowledged.append(event)
        return event


@contextlib.asynccontextmanager
async def hello_session(tmp_path: Path, **fields: Any) -> AsyncIterator[tuple[Stack, Session]]:
    """Session `s1` of the fake engine (`fields` go to its CreateSessionInput), its workspace
    holding `hello.txt` ("hello\\n", which the fake's `cat` reads) and a directory `sub`."""
    async with session_stack(tmp_path) as st:
        session = await st.sessions.create(CreateSessionInput(session_id="s1", **fields))
        box = st.engine.sandboxes[session.container_id]
        box.files["hello.txt"] = b"hello\n"
        box.dirs.add("sub")
        yield st, session


@contextlib.asynccontextmanager
async def audited_server(
    observer: de.Observer,
    add: Callable[[Any, grpc.aio.Server], None],
    servicer: object,
    stub: Callable[[grpc.aio.Channel], Stub],
) -> AsyncIterator[Stub]:
    """`servicer` (put in with its `add_..._to_server`) on a loopback port behind the audit
    interceptor over `observer`, and a `stub` to call it with; the server stops on exit."""
    server = grpc.aio.server(interceptors=[AuditInterceptor(observer)])
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield stub(channel)
    finally:
        await server.stop(0)
