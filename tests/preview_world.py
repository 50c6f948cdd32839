"""The preview domain and listener for a unit test, without Docker: `Previews` over the
SessionManager on the FakeEngine, the real listener on 127.0.0.1:0 relaying through the
`PortDialer` the test gives, and TCP servers of the test on loopback standing for the ports
inside a sandbox (each connection's handler task ends with the test)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from fakes import FakeArchive, FakeCommands, FakeEngine
from prometheus_client import CollectorRegistry
from sandboxd.audit.events import AuditEvent
from sandboxd.config import Config
from sandboxd.events import EventHub, ObservedStore
from sandboxd.models import Session
from sandboxd.previews import setup
from sandboxd.previews.dialer import ByteStream, PortDialer
from sandboxd.previews.publishing import Previews
from sandboxd.previews.relay import ClientStream
from sandboxd.sessions import SessionManager
from sandboxd.snapshot_store import SnapshotStore
from sandboxd.snapshots import SnapshotKeeper

D = TypeVar("D", bound=PortDialer)
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclasses.dataclass
class Parts(Generic[D]):
    dialer: D
    sessions: SessionManager
    previews: Previews
    audit: list[AuditEvent]
    registry: CollectorRegistry
    store: ObservedStore
    servers: list[asyncio.Server] = dataclasses.field(default_factory=list)
    handlers: set[asyncio.Task[None]] = dataclasses.field(default_factory=set)

    async def serve(self, handler: Handler) -> int:
        """A TCP server on loopback running `handler` per connection; its port."""

        async def guarded(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self.handlers.add(task)
            try:
                await handler(r, w)
            except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                await close(w)
                self.handlers.discard(task)

        server = await asyncio.start_server(guarded, "127.0.0.1", 0)
        self.servers.append(server)
        return int(server.sockets[0].getsockname()[1])


@contextlib.asynccontextmanager
async def preview_parts(
    tmp_path: Path, dialer: D, observer: Any = None, **settings: object
) -> AsyncIterator[Parts[D]]:
    settings.setdefault("preview_listen", "127.0.0.1:0")  # "": previews off
    config = Config(data_dir=tmp_path, **settings)
    engine = FakeEngine()
    audit: list[AuditEvent] = []
    registry = CollectorRegistry()
    async with ObservedStore(tmp_path / "sessions.db", EventHub()) as store:
        parts = await setup.prepare(config, store)
        snaps = await SnapshotStore(store.db, tmp_path / "snapshots").open()
        keeper = SnapshotKeeper(snaps, FakeArchive(engine), engine, "sbxunit")
        commands = FakeCommands(engine)
        sessions = SessionManager(
            config,
            engine,
            store,
            "sbxunit",
            keeper,
            on_session_end=[parts.end_session],
            commands=commands,
        )
        async with setup.serve(
            parts,
            config,
            commands=commands,
            router=None,
            store=store,
            sessions=sessions,
            metrics_registry=registry,
            audit=audit.append,
            dialer=dialer,
            **({"observer": observer} if observer is not None else {}),
        ) as previews:
            world = Parts(dialer, sessions, previews, audit, registry, store)
            try:
                yield world
            finally:
                for s in world.servers:
                    s.close()
                for task in list(world.handlers):
                    task.cancel()
                await asyncio.gather(*world.handlers, return_exceptions=True)
                for s in world.servers:
                    await s.wait_closed()


async def close(writer: asyncio.StreamWriter) -> None:
    """Closed and waited for: a transport left closing would warn in a later test's GC."""
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


class LoopbackDialer:
    """Dials a local TCP server per sandbox port (what `sbx dial` reaches inside a sandbox)."""

    def __init__(self) -> None:
        self.ports: dict[int, int] = {}
        self.dials = 0

    @contextlib.asynccontextmanager
    async def open(self, session: Session, port: int) -> AsyncIterator[ByteStream]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.ports[port])
        self.dials += 1
        try:
            yield ClientStream(reader, writer)
        finally:
            await close(writer)


World = Parts[LoopbackDialer]


async def backend(world: World, port: int, handler: Handler) -> None:
    """A local server for sandbox port `port`; its connections end with the test."""
    world.dialer.ports[port] = await world.serve(handler)


def world(tmp_path: Path, **settings: object) -> contextlib.AbstractAsyncContextManager[World]:
    return preview_parts(tmp_path, LoopbackDialer(), **settings)


def listener_port(url: str) -> int:
    return int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


async def exchange(url: str, raw: bytes, *, until: bytes = b"", read_all: bool = True) -> bytes:
    """`raw` sent on a new connection to the listener; what comes back until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", listener_port(url))
    try:
        writer.write(raw)
        await writer.drain()
        if until:
            return await asyncio.wait_for(reader.readuntil(until), 10)
        return await asyncio.wait_for(reader.read(), 10) if read_all else b""
    finally:
        await close(writer)


def req(path: str, token: str, *extra: str, method: str = "GET") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: x", f"X-Sandboxd-Token: {token}", *extra, "", ""]
    return "\r\n".join(lines).encode()
