"""How the server reaches a port inside a sandbox: a byte stream from a `PortDialer`.

With the in-sandbox agent's channel (docs/agent.md) it is an OPEN of kind `dial` on the
session's channel (`agent_dial.AgentDialer`); a sandbox without an agent channel starts
`sbx dial PORT` (helper/dial.c) as a sandbox command (`ExecDialer`, here). Both sit behind
the same `PortDialer` interface, so the relay (`listener.py`) never knows which. Either way
the sandbox needs no network interface.

`ByteStream` is the relay's view of one connection: buffered reads (a head up to its blank
line, exact lengths, whatever is there), writes that wait for the other side (backpressure),
and a half-close. Reads pull from the sandbox only when asked, so a slow preview client stops
the channel's stream (or the engine's), which stops the agent (or `sbx dial`) reading the
sandbox's socket.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from sandboxd.commands import Dial, SandboxCommands, Where
from sandboxd.engine import ExecStream
from sandboxd.models import Session

READ_CHUNK = 256 * 1024
STDERR_KEEP = 4096

Inspect = Callable[[bytes], None]


class ByteStream(Protocol):
    async def read_some(self, limit: int = READ_CHUNK) -> bytes:
        """What is there (at most `limit`, waiting for at least one byte); b"" at the end."""
        ...

    async def read_until(
        self, separator: bytes, limit: int, inspect: Inspect | None = None
    ) -> bytes:
        """Up to and including `separator`; raises `TooLong` past `limit`, `EOFError` at the end.
        `inspect` sees the bytes of the answer as they arrive, in order and each once (a
        parser that raises on the first bad byte, before the rest has come)."""
        ...

    async def read_exactly(self, n: int) -> bytes: ...

    async def write(self, data: bytes) -> None: ...

    def close_write(self) -> None: ...

    def failure(self) -> str:
        """Why the stream ended early, as the dialer saw it ("" when it did not say)."""
        ...

    def buffered(self) -> int:
        """Bytes read from the other side and not yet taken (after a whole answer: bytes the
        sandbox sent beyond it, which make its connection unfit for another request)."""
        ...


class TooLong(Exception):
    """A head or chunk line longer than allowed."""


class BackendReset(ConnectionResetError):
    """The sandbox's side of the connection was reset (not ended): what was relayed so far is
    not the whole of it, so the client's connection is aborted too."""


class PortDialer(Protocol):
    def open(
        self, session: Session, port: int
    ) -> contextlib.AbstractAsyncContextManager[ByteStream]:
        """A byte stream to 127.0.0.1:`port` inside the session's sandbox; closed on exit."""
        ...


class Buffered:
    """Buffered reads over a `pull()` of chunks (b"" at the end); the base of both sides."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._eof = False

    async def pull(self) -> bytes:
        raise NotImplementedError

    async def _fill(self) -> bool:
        if self._eof:
            return False
        data = await self.pull()
        if not data:
            self._eof = True
            return False
        self._buf += data
        return True

    async def read_some(self, limit: int = READ_CHUNK) -> bytes:
        if not self._buf and not self._eof:
            data = await self.pull()  # the common case of a body: passed on without a copy
            if not data:
                self._eof = True
                return b""
            if len(data) <= limit:
                return data
            self._buf += data
        if not self._buf:
            return b""
        n = limit
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def read_until(
        self, separator: bytes, limit: int, inspect: Inspect | None = None
    ) -> bytes:
        start = seen = 0
        while True:
            at = self._buf.find(separator, start)
            if at >= 0:
                end = at + len(separator)
                if end > limit:
                    raise TooLong
                if inspect is not None:
                    inspect(bytes(self._buf[seen:end]))
                out = bytes(self._buf[:end])
                del self._buf[:end]
                return out
            if len(self._buf) > limit:
                raise TooLong
            if inspect is not None and len(self._buf) > seen:
                inspect(bytes(self._buf[seen:]))
                seen = len(self._buf)
            start = max(0, len(self._buf) - len(separator) + 1)
            if not await self._fill():
                raise EOFError

    def buffered(self) -> int:
        return len(self._buf)

    async def readable(self) -> bool:
        """Whether more bytes come (waiting for the first of them); False at the end."""
        return bool(self._buf) or await self._fill()

    async def read_exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            if not await self._fill():
                raise EOFError
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out


class ExecByteStream(Buffered):
    """`sbx dial`'s stdout and stdin as a ByteStream; its stderr kept for the error line."""

    def __init__(self, stream: ExecStream) -> None:
        super().__init__()
        self._stream = stream
        self._stderr = bytearray()

    async def pull(self) -> bytes:
        while True:
            frame = await self._stream.read_joined(READ_CHUNK)
            if frame is None:
                return b""
            fd, data = frame
            if fd == 1:
                return data
            self._stderr += data[: max(0, STDERR_KEEP - len(self._stderr))]

    async def write(self, data: bytes) -> None:
        """A request to a `sbx dial` that already ended (nothing listened) is dropped: what
        the caller then reads is its end and its error line, which say why (a 502)."""
        try:
            await self._stream.write(data)
        except ConnectionError:
            return

    def close_write(self) -> None:
        self._stream.close_stdin()

    def failure(self) -> str:
        lines = self._stderr.decode(errors="replace").strip().splitlines()
        if not lines:
            return ""
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return str(json.loads(lines[-1])["error"])
        return "EIO"


class ExecDialer:
    """`sbx dial PORT` as a sandbox command, as the session's user."""

    def __init__(self, commands: SandboxCommands) -> None:
        self._commands = commands

    @contextlib.asynccontextmanager
    async def open(self, session: Session, port: int) -> AsyncIterator[ByteStream]:
        where = Where(session.container_id, session.spec.user)
        async with self._commands.open(where, Dial(port), stdin=True) as stream:
            yield ExecByteStream(stream)
