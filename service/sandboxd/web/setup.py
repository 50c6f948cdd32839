"""The web gateway's place in the server: a private socket on the gRPC server, and the listener.

The gRPC server listens, besides its port, on a Unix socket in a directory only this process's
user can enter (mode 0700, made fresh at each start and removed at the end); the gateway is its
one client there. A call through it is a call of the gRPC server: no servicer is built twice.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path

import grpc

from sandboxd.config import Config
from sandboxd.errors import ConfigError
from sandboxd.previews.listener import tls_context
from sandboxd.web.gateway import WebGateway
from sandboxd.web.methods import served_methods


def private_port(server: grpc.aio.Server, config: Config, stack: AsyncExitStack) -> str | None:
    """The gRPC server's private socket for the gateway (None when the gateway is off)."""
    if not config.web.listen:
        return None
    directory = Path(tempfile.mkdtemp(prefix="sandboxd-web-"))  # mode 0700, this user's
    stack.callback(shutil.rmtree, directory, True)
    target = f"unix:{directory / 'grpc.sock'}"
    if server.add_insecure_port(target) == 0:
        raise ConfigError(f"web_listen: cannot open the gateway's socket {target}")
    return target


async def start_gateway(
    config: Config, target: str, service_names: tuple[str, ...], stack: AsyncExitStack
) -> WebGateway:
    """The gateway serving `web_listen`, closed with the stack."""
    try:
        tls = tls_context(config.tenancy.tls_cert, config.tenancy.tls_key)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"web gateway: cannot load tls_cert/tls_key: {exc}") from None
    gateway = WebGateway(
        config.web,
        target,
        served_methods(service_names),
        tls=tls,
        max_message_bytes=config.max_message_bytes,
    )
    try:
        return await stack.enter_async_context(gateway)
    except OSError as exc:
        raise ConfigError(f"web_listen {config.web.listen}: {exc.strerror or exc}") from None
