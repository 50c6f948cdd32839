"""The door's one way into sandboxd: the server's own gRPC API, over loopback, as a client.

Every E2B call becomes the gRPC calls a sandboxd client would make, with the caller's API key
as its bearer token. So the door holds no domain logic and skips nothing: authentication and
the tenant, audit, stream caps, reply limits, lease renewal on activity, the command
allowlist, path confinement, quotas and every error reason are the gRPC server's, applied by
the same interceptors and servicers to this door's calls as to any other client's.
"""

from __future__ import annotations

import grpc

from sandboxd.e2b.connect import ConnectError
from sandboxd.v1 import (
    filesystem_pb2_grpc,
    process_pb2_grpc,
    session_pb2_grpc,
)

MAX_KEY_CHARS = 512
# Replies the door reads in one message (a file, a listing): the gRPC port's own ceiling.
MAX_MESSAGE_BYTES = 64 * 1024**2


def loopback_target(listen: str, port: int) -> str:
    """Where the gRPC port is reached from inside this process: its host, or loopback for a
    wildcard address."""
    host = listen.rpartition(":")[0].strip("[]")
    if host in ("", "0.0.0.0", "localhost"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_api_key(key: str | None) -> str:
    """An API key as a bearer token may carry it: printable ASCII, bounded; else 401."""
    if not key:
        raise ConnectError("unauthenticated", "missing X-API-KEY")
    if len(key) > MAX_KEY_CHARS or not all(0x21 <= ord(c) <= 0x7E for c in key):
        raise ConnectError("unauthenticated", "invalid API key")
    return key


class Backend:
    """The gRPC stubs on one channel to this server's port."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.sessions = session_pb2_grpc.SessionServiceStub(channel)
        self.processes = process_pb2_grpc.ProcessServiceStub(channel)
        self.files = filesystem_pb2_grpc.FilesystemServiceStub(channel)

    @staticmethod
    def open(
        target: str,
        credentials: grpc.ChannelCredentials | None = None,
        tls_name: str | None = None,
    ) -> Backend:
        options: list[tuple[str, str | int]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        if tls_name:
            options.append(("grpc.ssl_target_name_override", tls_name))
        if credentials is None:
            return Backend(grpc.aio.insecure_channel(target, options=options))
        return Backend(grpc.aio.secure_channel(target, credentials, options=options))

    async def close(self) -> None:
        await self.channel.close()


def metadata(api_key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),)
