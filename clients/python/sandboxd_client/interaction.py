"""A running Interact call: a command with live stdin, signals, resizes and maybe a PTY."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Self

import grpc

from sandboxd_client._call_end import CallEnd, is_write_failure
from sandboxd_client._gen.sandboxd.v1 import process_pb2
from sandboxd_client._rpc import UNSET
from sandboxd_client.errors import from_rpc_error
from sandboxd_client.events import Event, events_of

if TYPE_CHECKING:
    from sandboxd_client.client import SandboxClient


class Interaction:
    """A running Interact call: send stdin, signals and resizes; iterate its events.

    Leaving `async with` cancels the call (and so kills the command) if it is still running.
    """

    def __init__(self, client: SandboxClient, start: process_pb2.InteractStart) -> None:
        self._client = client
        self._start = start
        self._call: Any = None
        self._ends = CallEnd()

    async def __aenter__(self) -> Self:
        await self._client._check(self._client._deadline(UNSET))
        self._call = self._ends.watch(self._client.stubs.processes.Interact())
        await self._write(process_pb2.InteractRequest(start=self._start))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._call is not None:
            self._call.cancel()

    async def _write(self, req: process_pb2.InteractRequest) -> None:
        if self._call is None:
            raise RuntimeError("use `async with session.interact(...) as proc`")
        if self._ends.ended:
            return  # the call has ended: its events (and error) say why
        try:
            await self._call.write(req)
        except grpc.RpcError as err:
            if self._ends.ended_ok(err) or is_write_failure(self._ends.server_status(err)):
                # The command ended as this was written (the call's end may not have reached
                # this side yet): its events say how, or the server's error when they end.
                return
            raise from_rpc_error(self._ends.server_status(err), self._client.address) from None
        except grpc.aio.UsageError:
            pass  # the call has ended: its events (and error) say why

    async def send(self, data: bytes) -> None:
        await self._write(process_pb2.InteractRequest(stdin=process_pb2.InteractStdin(data=data)))

    async def close_stdin(self) -> None:
        await self._write(process_pb2.InteractRequest(close_stdin=process_pb2.InteractCloseStdin()))

    async def signal(self, signal: str) -> None:
        await self._write(
            process_pb2.InteractRequest(signal=process_pb2.InteractSignal(signal=signal))
        )

    async def resize(self, rows: int, cols: int) -> None:
        await self._write(
            process_pb2.InteractRequest(resize=process_pb2.InteractResize(rows=rows, cols=cols))
        )

    async def events(self, *, keepalives: bool = False) -> AsyncIterator[Event]:
        if self._call is None:
            raise RuntimeError("use `async with session.interact(...) as proc`")
        try:
            async for event in events_of(self._call, keepalives):
                yield event
            return
        except grpc.RpcError as err:
            if self._ends.ended_ok(err):
                return
            exc = from_rpc_error(self._ends.server_status(err), self._client.address)
        raise exc

    def __aiter__(self) -> AsyncIterator[Event]:
        return self.events()
