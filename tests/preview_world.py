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
from typing import Generic, TypeVar

from fakes import FakeArchive, FakeEngine
from prometheus_client import CollectorRegistry
from sandboxd.audit.events import AuditEvent
from sandboxd.config import Config
from sandboxd.events import EventHub, ObservedStore
from sandboxd.previews import setup
from sandboxd.previews.dialer import PortDialer
from sandboxd.previews.publishing import Previews
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
async def preview_parts(tmp_path: Path, dialer: D, **settings: object) -> AsyncIterator[Parts[D]]:
    settings.setdefault("preview_listen", "127.0.0.1:0")  # "": previews off
    config = Config(data_dir=tmp_path, **settings)
    engine = FakeEngine()
    audit: list[AuditEvent] = []
    registry = CollectorRegistry()
    async with ObservedStore(tmp_path / "sessions.db", EventHub()) as store:
        parts = await setup.prepare(config, store)
        snaps = await SnapshotStore(store.db, tmp_path / "snapshots").open()
        keeper = SnapshotKeeper(snaps, FakeArchive(engine), engine, "sbxunit")
        sessions = SessionManager(
            config, engine, store, "sbxunit", keeper, on_session_end=[parts.end_session]
        )
        async with setup.serve(
            parts,
            config,
            engine=engine,
            store=store,
            sessions=sessions,
            metrics_registry=registry,
            audit=audit.append,
            dialer=dialer,
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
