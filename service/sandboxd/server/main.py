"""Assemble and run the server: the composition of its three parts.

`server.parts` builds the collaborators (engine, stores, managers) from the configuration,
`server.transport` the gRPC server with every servicer, `server.run` starts the listeners in order,
runs the background work and owns the shutdown order.

Whoever creates a resource closes it: everything long-lived is entered into one
AsyncExitStack, background work runs in one TaskGroup, and SIGTERM drains in-flight calls
(health NOT_SERVING -> server.stop(grace) -> close the engine). A second SIGTERM forces it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

from sandboxd.config import Config
from sandboxd.server import parts as server_parts
from sandboxd.server import run as server_run
from sandboxd.server.transport import SERVICE_NAMES, grpc_server, listen
from sandboxd.web.setup import private_port, start_gateway

__all__ = ["SERVICE_NAMES", "owner_id_for", "serve", "write_port_file"]

log = logging.getLogger(__name__)


def owner_id_for(config: Config) -> str:
    """This server's label value: configured, or made once and kept in the data directory."""
    if config.server.owner_id:
        return config.server.owner_id
    path = config.server.data_dir / "owner-id"
    if path.exists():
        return path.read_text().strip()
    owner = "sbx" + secrets.token_hex(4)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(owner + "\n")
    return owner


def _signals() -> tuple[asyncio.Event, asyncio.Event, asyncio.Event]:
    """(stop, force, reload): the first SIGTERM/SIGINT asks for a drain, a second for an end
    now; SIGHUP asks for the tokens file again (and never ends the server, its default)."""
    stop = asyncio.Event()
    force = asyncio.Event()
    reload = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            force.set()
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    loop.add_signal_handler(signal.SIGHUP, reload.set)
    return stop, force, reload


async def _nothing_to_reload(reload: asyncio.Event) -> None:
    while True:
        await reload.wait()
        reload.clear()
        log.info("SIGHUP: no tokens_file is configured, nothing to reload")


async def serve(config: Config, *, ready: Callable[[int], None] | None = None) -> None:
    owner_id = owner_id_for(config)
    stop, force, reload = _signals()
    async with AsyncExitStack() as stack:
        parts = await server_parts.build(config, owner_id, stack)
        server, health_servicer = grpc_server(config, parts)
        port = listen(server, config)
        web_target = private_port(server, config, stack)
        monitor = await server_run.start(config, parts, server, health_servicer, stack)
        if web_target is not None:
            await start_gateway(config, web_target, SERVICE_NAMES, stack)
        if config.e2b.listen:
            from sandboxd.e2b.listener import door  # hypercorn is loaded only when it serves

            await stack.enter_async_context(door(config, port))
        host = config.server.listen.rpartition(":")[0]
        log.info("sandboxd listening on %s:%d (owner id %s)", host, port, owner_id)
        if ready is not None:
            ready(port)
        async with asyncio.TaskGroup() as tg:
            background = await server_run.background(tg, config, parts, monitor)
            if parts.tokens is not None:
                background.append(tg.create_task(parts.tokens.reload_on(reload)))
            else:
                background.append(tg.create_task(_nothing_to_reload(reload)))
            await stop.wait()
            await server_run.shut_down(config, parts, server, health_servicer, force)
            for task in background:
                task.cancel()
    log.info("stopped")


def write_port_file(path: Path, port: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{port}\n")
    tmp.replace(path)
