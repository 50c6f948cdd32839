"""A byte stream of the agent channel (`egress`, `dial`: DATA and EOF on fd 0, CLOSE when done)
as an asyncio Transport, so its user gets real `StreamReader`/`StreamWriter` objects.

The channel's reader hands each frame straight to the stream's protocol (never blocking), and
flow control follows asyncio's: the window the agent may fill is granted back only while the
protocol reads (`pause_reading` holds the WINDOW updates, `resume_reading` sends them), so
what waits in the server is bounded by the reader's limit plus the stream's window (which grows
for a reader that keeps up, at most to `window_max`: streams.py); writes wait for the
agent's window in the transport's own writer task, and the protocol is paused above the high
water mark (`StreamWriter.drain` waits). `write_eof` is EOF fd 0 (a half-close), `close` sends
what is buffered and then CLOSE, `abort` is RESET at once. RESET from the agent, or the end of
the channel's epoch, is `connection_lost` with a ConnectionResetError.

A `ByteStream` hands its frames to a `StreamSink`: the `ChannelTransport` here, or another
consumer that reads the frames as they are (the previews' relay, previews/agent_dial.py). A
stream the server opens may receive DATA before its user attaches a sink (the OPEN_OK and the
first bytes can arrive in one read); those wait in the stream (at most one window).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from sandboxd.agent import frames
from sandboxd.agent.frames import FrameType, StreamError
from sandboxd.agent.streams import AgentStream
from sandboxd.digits import decimal
from sandboxd.errors import SandboxError

log = logging.getLogger(__name__)

FD = 0
HIGH_WATER = 64 * 1024
LOW_WATER = 16 * 1024
CLOSE_FLUSH_S = 10.0  # a closed transport's last bytes wait at most this for the agent's window


class StreamSink(Protocol):
    """Where a `ByteStream`'s frames go (called by the channel's reader: never blocking)."""

    def received(self, chunk: bytes) -> None: ...

    def received_eof(self) -> None: ...

    def ended(self, error: SandboxError | None) -> None: ...


class ByteStream(AgentStream):
    """An fd-0 stream whose frames go to a `StreamSink` instead of a read buffer."""

    transport: StreamSink | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._early: list[bytes] = []  # arrived before a sink was attached
        self._early_eof = False

    @property
    def window(self) -> int:
        """The window the server grants the agent now (a sink grants back by halves of it;
        it grows while the sink keeps up)."""
        return self._window

    def attach(self, sink: StreamSink) -> None:
        """Give the stream its sink; what arrived before (bytes, EOF, the end) goes there now."""
        self.transport = sink
        early, self._early = self._early, []
        for chunk in early:
            sink.received(chunk)
        if self._early_eof:
            sink.received_eof()
        if self.ended:
            sink.ended(self.error)

    def on_reset(self, doc: dict[str, Any]) -> None:
        """As any stream's, and the agent's name for it (REFUSED, IO...) kept in the error's
        metadata, `agent_error`: a byte stream's user maps it to its own answer."""
        super().on_reset(doc)
        if self.error is not None:
            self.error.metadata.setdefault("agent_error", self.reset_name)

    def on_data(self, fd: int, chunk: bytes) -> None:
        self._require_open("DATA")
        if fd != FD:
            raise StreamError(f"DATA on fd {fd} of a byte stream")
        if FD in self._eof:
            raise StreamError("DATA after EOF")
        if len(chunk) > self._credit:
            raise StreamError(
                f"{len(chunk)} bytes of DATA with a window of {self._credit}", "FLOW_CONTROL"
            )
        self._credit -= len(chunk)
        if chunk and self.transport is not None:
            self.transport.received(chunk)
        elif chunk:
            self._early.append(chunk)

    def on_eof(self, fd: int) -> None:
        self._require_open("EOF")
        if fd != FD or FD in self._eof:
            raise StreamError(f"EOF on fd {fd} (unknown or twice)")
        self._eof.add(fd)
        if self.transport is not None:
            self.transport.received_eof()
        else:
            self._early_eof = True

    def on_exit(self, doc: dict[str, Any]) -> None:
        raise StreamError("EXIT on a byte stream")

    def grant(self, consumed: int) -> None:
        """Give the agent back `consumed` bytes of window (what the protocol has taken), and
        grow the window when the sink keeps up (what it has not taken is counted unread)."""
        if consumed > 0 and not self.ended:
            self._grant_back(consumed)

    def finish(self) -> None:
        """CLOSE: done in both directions; the stream ends here without an answer."""
        if not self.ended:
            self._send_now(frames.encode(FrameType.CLOSE, self.id))
            self._end()

    def _end(self) -> None:
        super()._end()
        if self.transport is not None:
            self.transport.ended(self.error)


class ChannelTransport(asyncio.Transport):
    """The asyncio side of one `ByteStream`; `StreamWriter.start_tls` works on it (the
    secrets relay terminates TLS on a sandbox's connection)."""

    _start_tls_compatible = True  # what loop.start_tls checks

    def __init__(
        self,
        stream: ByteStream,
        protocol: asyncio.BaseProtocol,
        *,
        extra: dict[str, Any] | None = None,
        on_done: Callable[[ByteStream], None] | None = None,
    ) -> None:
        super().__init__(extra)
        self._stream = stream
        self._protocol = protocol
        self._on_done = on_done  # called once when the stream has ended (the channel forgets it)
        self._loop = asyncio.get_running_loop()
        self._out: collections.deque[bytes] = collections.deque()
        self._out_bytes = 0
        self._pending = asyncio.Event()
        self._writing_paused = False
        self._reading = True
        self._unacked = 0  # bytes taken by the protocol, not yet granted back
        # What arrived while reading was paused: delivered on resume (at most one window,
        # as no WINDOW goes out meanwhile); EOF after them.
        self._held: collections.deque[bytes] = collections.deque()
        self._held_eof = False
        self._delivering = False
        self._end_after_held = False  # ended cleanly while data was held: lost after it
        self._eof_wanted = False
        self._closing = False
        self._lost = False
        self._writer = self._loop.create_task(self._write_loop(), name=f"byte-stream {stream.id}")
        stream.transport = self
        self._call(protocol.connection_made, self)  # a failing acceptor resets this stream
        if stream.ended:  # failed before it was wired: deliver that now
            self.ended(stream.error)

    # ----- from the stream (the channel's reader) -----------------------------------------

    def received(self, chunk: bytes) -> None:
        if self._lost:
            return
        if not self._reading or self._held:
            self._held.append(chunk)  # as a socket while paused: it stays unread
            return
        self._unacked += len(chunk)
        self._call(_feed, self._protocol, chunk)
        self._grant()

    def received_eof(self) -> None:
        if self._lost:
            return
        if not self._reading or self._held:
            self._held_eof = True
            return
        self._eof()

    def _eof(self) -> None:
        protocol = self._protocol
        keep_open = False
        if isinstance(protocol, asyncio.Protocol | asyncio.BufferedProtocol):  # TLS: buffered
            keep_open = self._call(protocol.eof_received)
        if not keep_open:
            self.close()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A protocol callback; what it raises ends this stream, never the channel's reader."""
        try:
            return fn(*args)
        except Exception as exc:
            log.warning("byte stream %d: its protocol failed: %r", self._stream.id, exc)
            self.abort()
            return None

    def _deliver_held(self) -> None:
        """After resume_reading: what arrived meanwhile, while reading stays on."""
        self._delivering = False
        while self._held and self._reading and not self._lost:
            chunk = self._held.popleft()
            self._unacked += len(chunk)
            self._call(_feed, self._protocol, chunk)
        if self._held_eof and not self._held and self._reading and not self._lost:
            self._held_eof = False
            self._eof()
        if self._end_after_held and not self._held and not self._held_eof and not self._lost:
            self._lose(None)
            return
        self._grant()

    def ended(self, error: SandboxError | None) -> None:
        """The stream ended (CLOSE, RESET, the epoch's end, or our own finish). Nothing more
        is written; a clean end delivers what is held first (a reset drops it, as a socket)."""
        if self._lost or self._end_after_held:
            return
        self._closing = True
        self._out.clear()
        self._out_bytes = 0
        if asyncio.current_task() is not self._writer:
            self._writer.cancel()
        if self._on_done is not None:
            self._loop.call_soon(self._on_done, self._stream)
        if error is None and (self._held or self._held_eof):
            self._end_after_held = True
            return
        self._lose(ConnectionResetError(str(error)) if error is not None else None)

    def _lose(self, exc: Exception | None) -> None:
        self._lost = True
        self._held.clear()
        self._loop.call_soon(self._protocol.connection_lost, exc)

    def _grant(self) -> None:
        if self._lost or not self._reading or self._held:
            return
        if self._unacked >= self._stream.window // 2:
            consumed, self._unacked = self._unacked, 0
            self._stream.grant(consumed)

    # ----- asyncio.ReadTransport ----------------------------------------------------------

    def is_reading(self) -> bool:
        return self._reading and not self._lost

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if self._reading:
            return
        self._reading = True
        if not self._delivering:  # later, as a socket's next read: never inside the caller
            self._delivering = True
            self._loop.call_soon(self._deliver_held)

    # ----- asyncio.WriteTransport ---------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self._eof_wanted:
            return  # as a socket transport after close: dropped (its user closed it)
        if not data:
            return
        self._out.append(bytes(data))
        self._out_bytes += len(data)
        self._pending.set()
        if not self._writing_paused and self._out_bytes > HIGH_WATER:
            self._writing_paused = True
            self._protocol.pause_writing()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self._closing or self._eof_wanted:
            return
        self._eof_wanted = True
        self._pending.set()

    def get_write_buffer_size(self) -> int:
        return self._out_bytes

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return LOW_WATER, HIGH_WATER

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # fixed: the channel's window bounds the rest

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Send what is buffered, then CLOSE."""
        if self._end_after_held and not self._lost:  # ended already; drop what is held
            self._lose(None)
            return
        if self._closing:
            return
        self._closing = True
        self._pending.set()

    def abort(self) -> None:
        if self._lost:
            return
        if self._end_after_held:
            self._lose(ConnectionResetError("aborted"))
            return
        self._stream.reset("ABORTED", "the server's end of the connection was aborted")

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    # ----- the writer task ----------------------------------------------------------------

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._pending.wait()
                self._pending.clear()
                while self._out:
                    chunk = self._out.popleft()
                    if self._closing:
                        async with asyncio.timeout(CLOSE_FLUSH_S):
                            await self._stream.write(FD, chunk)
                    else:
                        await self._stream.write(FD, chunk)
                    self._out_bytes -= len(chunk)
                    if self._writing_paused and self._out_bytes <= LOW_WATER:
                        self._writing_paused = False
                        self._protocol.resume_writing()
                if self._closing:
                    self._stream.finish()
                    return
                if self._eof_wanted:
                    self._stream.send_eof(FD)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            self._stream.reset("TIMEOUT", "the agent took no more bytes of a closed connection")
        except (ConnectionError, SandboxError):
            with contextlib.suppress(SandboxError):
                self._stream.reset("IO", "the server could not write to the stream")


def _feed(protocol: asyncio.BaseProtocol, chunk: bytes) -> None:
    """Data to a protocol, buffered (TLS: asyncio's SSLProtocol) or not."""
    if isinstance(protocol, asyncio.BufferedProtocol):
        view = memoryview(chunk)
        while view:
            buf = memoryview(protocol.get_buffer(len(view)))
            n = min(len(buf), len(view))
            if n == 0:
                raise RuntimeError("a buffered protocol offered an empty buffer")
            buf[:n] = view[:n]
            protocol.buffer_updated(n)
            view = view[n:]
    elif isinstance(protocol, asyncio.Protocol):
        protocol.data_received(chunk)


def open_stream_pair(
    stream: ByteStream,
    *,
    limit: int = 2**16,
    extra: dict[str, Any] | None = None,
    on_done: Callable[[ByteStream], None] | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """StreamReader/StreamWriter over `stream`, as `asyncio.open_connection` gives them (the
    client's end: `start_tls` is a TLS client); `limit` is the reader's, which also bounds
    what waits unread."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport = ChannelTransport(stream, protocol, extra=extra, on_done=on_done)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


def serve_stream(
    stream: ByteStream,
    accept: Callable[[asyncio.StreamReader, asyncio.StreamWriter], None],
    *,
    limit: int = 2**16,
    extra: dict[str, Any] | None = None,
    on_done: Callable[[ByteStream], None] | None = None,
) -> None:
    """Hand `stream` to `accept` as `asyncio.start_server` hands a connection to its callback
    (the server's end: `start_tls` is a TLS server)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, accept, loop=loop)
    ChannelTransport(stream, protocol, extra=extra, on_done=on_done)  # connection_made: accept


def peer_of(doc: dict[str, Any]) -> tuple[str, int] | None:
    """The agent's `peer` ("127.0.0.1:PORT") as a peername; None when absent or malformed."""
    peer = doc.get("peer")
    if not isinstance(peer, str) or len(peer) > 64:
        return None
    host, sep, port_text = peer.rpartition(":")
    port = decimal(port_text, max_digits=5)
    if not sep or port is None or not 0 < port < 65536:
        return None
    return host, port
