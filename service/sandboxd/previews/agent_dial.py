"""Previews over the agent's own `dial` streams (docs/agent.md): the agent connects to
127.0.0.1:PORT itself and carries the bytes on its channel, so a preview connection starts no
process in the sandbox, and its bytes go from the channel's frames to the relay as they are.

A sandbox without an agent channel (`[agent] enabled = false`, or a sandbox whose main
process is not the agent: a gVisor one without egress) keeps `sbx dial` over an exec
(`ExecDialer`). Any agent of the sandbox will do, as for egress: a loopback connection does
not depend on the uid that makes it (an ALLOWLIST gVisor sandbox's agent runs as the keeper).

How the relay sees the channel's answers:
- RESET `REFUSED` (nothing listens) ends the stream at once with failure "ECONNREFUSED", as
  `sbx dial` says it: the listener answers 502;
- an OPEN_OK that does not come is a silent sandbox: the relay's timeouts (the request head's
  write and the answer head) cover the OPEN too, so the client gets 504;
- EOF is the sandbox's half-close (reads end, b""), `close_write` sends ours;
- a RESET after the OPEN (IO, the epoch's end) is `BackendReset` from a read once what arrived
  before it is read: the client connection is then aborted, never ended as if complete.

Backpressure: the agent may send at most one window; the window is granted back only as the
relay takes the bytes, and the relay takes them only once the client took the previous ones.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from sandboxd.agent.byte_stream import FD, ByteStream
from sandboxd.agent.channel import Channel
from sandboxd.errors import SandboxError
from sandboxd.models import Session
from sandboxd.previews.dialer import (
    READ_CHUNK,
    BackendReset,
    Buffered,
    PortDialer,
)
from sandboxd.previews.dialer import ByteStream as RelayStream

Channels = Callable[[str], Awaitable[Channel | None]]  # AgentRouter.open


class AgentDialer:
    """OPEN `dial` on the sandbox's channel; `fallback` (sbx dial over an exec) without one."""

    def __init__(self, channels: Channels, fallback: PortDialer) -> None:
        self._channels = channels
        self._fallback = fallback

    @contextlib.asynccontextmanager
    async def open(self, session: Session, port: int) -> AsyncIterator[RelayStream]:
        try:
            channel = await self._channels(session.container_id)
        except SandboxError as exc:  # the agent does not answer: a stream that says so
            yield FailedStream(why_of(exc))
            return
        if channel is None:
            async with self._fallback.open(session, port) as stream:
                yield stream
            return
        dial = DialStream(channel, port)
        try:
            yield dial
        finally:
            await dial.aclose()


def why_of(error: SandboxError) -> str:
    """The failure a preview reports: the agent's RESET name when it reset the stream, else
    the error's reason (AGENT_RESTARTED, AGENT_UNAVAILABLE...)."""
    name = error.metadata.get("agent_error", "")
    return in_dial_words(name) if name else error.reason


def in_dial_words(name: str) -> str:
    """The agent's RESET name as `sbx dial` says it where it has one (the listener's 502
    says "nothing listens" for ECONNREFUSED)."""
    return "ECONNREFUSED" if name == "REFUSED" else name


class DialStream(Buffered):
    """One `dial` stream as the relay's ByteStream, and the sink of its frames (called by the
    channel's reader: never blocking)."""

    def __init__(self, channel: Channel, port: int) -> None:
        super().__init__()
        self._channel = channel
        self._stream: ByteStream | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._arrived = asyncio.Event()
        self._eof_in = False  # the sandbox half-closed
        self._ended = False
        self._error: SandboxError | None = None
        self._why = ""
        self._unacked = 0  # bytes the relay took, not yet granted back
        self._eof_wanted = False
        # The OPEN runs on its own (never cancelled by a caller's timeout, only by aclose):
        # the relay's first write and read wait for it within their own timeouts.
        self._opening = asyncio.get_running_loop().create_task(self._open(port))

    async def _open(self, port: int) -> None:
        try:
            stream = await self._channel.open(
                "dial", {"port": port}, fds=frozenset({FD}), cls=ByteStream
            )
        except SandboxError as exc:
            self.ended(exc)
            return
        except ConnectionError as exc:  # the channel's writer is gone
            self._why = "AGENT_UNAVAILABLE"
            self.ended(SandboxError(str(exc)))
            return
        assert isinstance(stream, ByteStream)
        self._stream = stream
        stream.attach(self)
        if self._eof_wanted:
            stream.send_eof(FD)

    async def _opened(self) -> ByteStream | None:
        if not self._opening.done():
            await asyncio.wait({self._opening})
        return self._stream

    async def aclose(self) -> None:
        """CLOSE (both directions done) and forget the stream; an OPEN still waiting is
        cancelled (the channel resets it)."""
        if not self._opening.done():
            self._opening.cancel()
            await asyncio.wait({self._opening})
        stream = self._stream
        if stream is not None:
            stream.finish()
            self._channel.release(stream)

    # ----- the sink (byte_stream.StreamSink) ------------------------------------------------

    def received(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._arrived.set()

    def received_eof(self) -> None:
        self._eof_in = True
        self._arrived.set()

    def ended(self, error: SandboxError | None) -> None:
        self._ended = True
        if error is not None and self._error is None:
            self._error = error
            name = self._stream.reset_name if self._stream is not None else ""
            self._why = self._why or (in_dial_words(name) if name else why_of(error))
        self._arrived.set()

    # ----- the relay's side (dialer.ByteStream) ----------------------------------------------

    async def pull(self) -> bytes:
        await self._opened()
        while not self._chunks:
            if self._eof_in or (self._ended and self._error is None):
                return b""
            if self._error is not None:
                raise BackendReset(self._why)
            self._arrived.clear()
            await self._arrived.wait()
        if len(self._chunks) == 1 or len(self._chunks[0]) >= READ_CHUNK:
            data = self._chunks.popleft()  # the frame's bytes as they are
        else:
            parts = [self._chunks.popleft()]
            size = len(parts[0])
            while self._chunks and size + len(self._chunks[0]) <= READ_CHUNK:
                parts.append(self._chunks.popleft())
                size += len(parts[-1])
            data = b"".join(parts)
        self._grant(len(data))
        return data

    def _grant(self, n: int) -> None:
        stream = self._stream
        self._unacked += n
        if stream is not None and self._unacked >= stream.window // 2:
            stream.grant(self._unacked)
            self._unacked = 0

    async def write(self, data: bytes) -> None:
        """To a stream that has ended, dropped: what the relay then reads says why."""
        stream = await self._opened()
        if stream is None:
            return
        with contextlib.suppress(SandboxError, ConnectionError):
            await stream.write(FD, data)

    def close_write(self) -> None:
        if self._stream is not None:
            self._stream.send_eof(FD)
        else:
            self._eof_wanted = True

    def failure(self) -> str:
        return self._why


class FailedStream(Buffered):
    """A connection that could not begin (its sandbox's agent does not answer)."""

    def __init__(self, why: str) -> None:
        super().__init__()
        self._why = why

    async def pull(self) -> bytes:
        raise BackendReset(self._why)

    async def write(self, data: bytes) -> None:
        return None

    def close_write(self) -> None:
        return None

    def failure(self) -> str:
        return self._why
