"""One multiplexed channel to one sandbox's agent (docs/agent.md): the reader task, the writer
task, keepalive, epochs, and the dispatch of frames to streams.

Damage stays where it belongs: a frame that breaks a stream's rules resets that stream only
(RESET PROTOCOL / FLOW_CONTROL); input that cannot be parsed ends the epoch (every stream of
it fails with AGENT_RESTARTED, and a new epoch begins on the same pipe); silence (no HELLO_OK
within `handshake_s`, or two keepalive periods) makes the channel LOST, for its owner to rescue.
Nothing the agent sends can raise out of the reader, and the reader never waits on anything
but the pipe (its answers go through `FrameWriter.send_now`, which never blocks) and its
tenant's fair share: `pace` (sandboxd.admission) says how long to wait before the next read
when the tenant's sessions move more output than their share while other tenants are active.
Not reading is the backpressure: the pipe fills and the agent's writes wait, in the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sandboxd.agent import frames
from sandboxd.agent.channel_state import Hello, State, deliver
from sandboxd.agent.frames import Frame, FrameDecoder, FrameError, FrameType, StreamError
from sandboxd.agent.streams import (
    AgentStream,
    agent_restarted,
    agent_unavailable,
    protocol_error,
)
from sandboxd.agent.transport import FrameWriter, Transport, WriterOverflow
from sandboxd.errors import InvalidArgument, SandboxError

log = logging.getLogger(__name__)

EPOCH_ERRORS_PER_MINUTE = 5  # more protocol epochs than this: the agent is broken, LOST

S = TypeVar("S", bound=AgentStream)
# A stream the agent opened (egress): (channel, stream id, its OPEN request). The handler
# answers at once, never blocking: `accept` (OPEN_OK) or `refuse` (RESET).
PeerOpen = Callable[["Channel", int, dict[str, Any]], None]
# Bytes just read from the agent -> seconds to wait before reading more (0: read on).
Pace = Callable[[int], float]
MAX_PAUSE_S = 1.0  # one pause, whatever a pacer says: far inside the keepalive's bound


async def pause(seconds: float) -> None:
    """The reader's wait when its tenant is over its share (a module function, so the unit
    tests can hold the reader there and see what it did not read meanwhile)."""
    await asyncio.sleep(seconds)


class _EpochError(Exception):
    """The epoch must end (input that cannot be parsed, or GOAWAY)."""


class Channel:
    def __init__(
        self,
        transport: Transport,
        *,
        name: str,
        window: int = frames.DEFAULT_WINDOW,
        window_max: int = 0,
        keepalive_s: float = 5.0,
        handshake_s: float = 10.0,
        resend_s: float = 0.5,
        on_lost: Callable[[Channel, str], None] | None = None,
        egress_port: Callable[[], int] | int = 0,
        on_peer_open: PeerOpen | None = None,
        budget: int = 0,
        pace: Pace | None = None,
        guard: Mapping[str, int] | None = None,
    ) -> None:
        self.name = name
        self._pace = pace
        self._budget = budget  # HELLO's: the agent's memory budget (agent/memory.py); 0 none
        self._guard = dict(guard or {})  # HELLO's: gVisor's limits the agent keeps (memory.py)
        self._egress_port = egress_port  # HELLO's (asked at each epoch): the agent's listener
        self._on_peer_open = on_peer_open
        self._transport = transport
        self._window = window
        self._window_max = window_max  # a stream's inbound window grows to this (streams.py)
        self._keepalive_s = keepalive_s
        self._handshake_s = handshake_s
        self._resend_s = resend_s
        self._on_lost = on_lost
        # Set while its sandbox is checkpointed (a memory suspend): the error its streams end
        # with when the checkpoint stops the sandbox, instead of "does not answer".
        self.ending: Callable[[], SandboxError] | None = None
        self._writer = FrameWriter(transport)
        self._decoder = FrameDecoder()
        self._streams: dict[int, AgentStream] = {}
        self._next_id = 1
        self._peer_last_id = 0
        self._nonce = ""
        self.epoch = 0
        self.state = State.CONNECTING
        self.why = ""  # why the channel is LOST or CLOSED
        self.hello = Hello()
        self._settled = asyncio.Event()  # set when the state leaves CONNECTING
        self._last_rx = time.monotonic()
        self._pinged = False
        self._epoch_errors: list[float] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._resend: asyncio.Task[None] | None = None

    # ----- life ----------------------------------------------------------------------------

    async def start(self) -> Hello:
        """Start the tasks and the first epoch; the agent's HELLO_OK, or AGENT_UNAVAILABLE."""
        loop = asyncio.get_running_loop()
        for coro in (self._writer_task(), self._read(), self._keepalive()):
            self._tasks.append(loop.create_task(coro, name=f"agent-channel {self.name}"))
        return await self.resync()

    async def resync(self) -> Hello:
        """Begin a new epoch (SYNC + HELLO) and wait for its HELLO_OK."""
        if self.state is State.CLOSED:
            raise agent_unavailable(f"the agent channel of {self.name} is closed: {self.why}")
        self._new_epoch(agent_restarted("the agent channel was re-established"))
        await self.ready()
        return self.hello

    async def ready(self) -> None:
        """Wait out a handshake in progress; AGENT_UNAVAILABLE unless the channel is READY."""
        await self._settled.wait()
        if self.state is not State.READY:
            raise agent_unavailable(f"the sandbox's agent does not answer: {self.why}")

    async def close(self, why: str = "closed by the server") -> None:
        self._end(State.CLOSED, why, notify=False)
        if self._resend is not None:
            self._tasks.append(self._resend)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks.clear()
        with contextlib.suppress(Exception):
            await self._transport.close()

    # ----- streams -------------------------------------------------------------------------

    async def open(
        self,
        kind: str,
        request: dict[str, Any],
        *,
        fds: frozenset[int] = frozenset({1, 2}),
        cls: type[AgentStream] = AgentStream,
        eof: tuple[int, ...] = (),
    ) -> AgentStream:
        """A stream of `kind` once the agent answered OPEN_OK; `cls` is the stream's class (a
        byte stream's frames go to its own sink). `eof`: fds whose EOF goes in the same write
        as the OPEN (the agent reads them after it, so they close what the OPEN started, and
        ignores them if it refused it: an id opened in this epoch)."""
        await self.ready()
        try:
            frame = frames.encode_json(FrameType.OPEN, self._next_id, {"kind": kind, **request})
        except ValueError as exc:
            raise InvalidArgument(
                f"the {kind} request is too large for the channel: {exc}"
            ) from None
        stream = cls(
            self._next_id,
            kind,
            window=self._window,
            window_max=self._window_max,
            send=self._writer.send,
            send_now=self._send_now,
            fds=fds,
        )
        self._streams[stream.id] = stream
        self._next_id += 2
        if eof:
            frame += b"".join(frames.eof(stream.id, fd) for fd in eof)
            stream.eof_sent(eof)
        try:
            await self._writer.send(frame)
            await stream.opened
        except BaseException:
            self.release(stream)
            raise
        return stream

    def release(self, stream: AgentStream) -> None:
        """The user is done with `stream`: reset it if it still runs, and forget it."""
        if not stream.ended and self._streams.get(stream.id) is stream:
            with contextlib.suppress(SandboxError):
                stream.reset("CANCELLED")
        if self._streams.get(stream.id) is stream:
            del self._streams[stream.id]

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    # ----- epochs --------------------------------------------------------------------------

    def _new_epoch(self, error: SandboxError, goaway: bytes = b"") -> None:
        self.epoch += 1
        self._fail_streams(error)
        self._writer.clear()
        if goaway:
            self._send_now(goaway)
        self._next_id = 1
        self._peer_last_id = 0
        self._nonce = secrets.token_hex(16)
        self._decoder.scan_for(self._nonce)
        self.state = State.CONNECTING
        self._settled.clear()
        if self._resend is not None:
            self._resend.cancel()
        self._resend = asyncio.get_running_loop().create_task(self._handshake())

    def _hello_frames(self) -> bytes:
        hello = {
            "version": frames.VERSION,
            "nonce": self._nonce,
            "window": self._window,
            "keepalive_ms": int(self._keepalive_s * 1000),
            "egress_port": self._egress_port()
            if callable(self._egress_port)
            else self._egress_port,
        }
        # Only what is set: an agent older than a field is never sent it.
        hello |= {k: v for k, v in (("budget", self._budget), ("guard", self._guard)) if v}
        return frames.SYNC + frames.encode_json(FrameType.HELLO, 0, hello)

    async def _handshake(self) -> None:
        """SYNC + HELLO every `resend_s` until the HELLO_OK, for at most `handshake_s`."""
        deadline = time.monotonic() + self._handshake_s
        while self.state is State.CONNECTING:
            if time.monotonic() >= deadline:
                self._end(State.LOST, f"no HELLO_OK within {self._handshake_s:g} s")
                return
            self._send_now(self._hello_frames())
            await asyncio.sleep(self._resend_s)

    def _synced(self, frame: Frame) -> None:
        doc = frames.parse_json(frame)
        if doc.get("version") != frames.VERSION:
            self._end(State.LOST, f"the agent speaks protocol version {doc.get('version')!r}")
            return
        procs = doc.get("processes")
        pid = doc.get("pid")
        self.hello = Hello(
            instance=str(doc.get("instance", ""))[:128],
            pid=pid if isinstance(pid, int) else 0,
            processes=[p for p in procs if isinstance(p, dict)] if isinstance(procs, list) else [],
        )
        self.state = State.READY
        self._last_rx = time.monotonic()
        self._pinged = False
        self._settled.set()

    def _epoch_failed(self, why: str) -> None:
        """Input that cannot be parsed: end this epoch and begin another (or give up when
        the agent keeps doing it)."""
        now = time.monotonic()
        self._epoch_errors = [t for t in self._epoch_errors if now - t < 60] + [now]
        log.warning("agent channel %s: epoch %d ended: %s", self.name, self.epoch, why)
        if len(self._epoch_errors) > EPOCH_ERRORS_PER_MINUTE:
            self._end(State.LOST, f"protocol errors in a row ({why})")
            return
        goaway = frames.encode_json(FrameType.GOAWAY, 0, {"error": "PROTOCOL", "message": why})
        self._new_epoch(agent_restarted(f"the agent broke the channel protocol: {why}"), goaway)

    def _end(self, state: State, why: str, *, notify: bool = True) -> None:
        if self.state in (State.CLOSED, State.LOST) and state is not State.CLOSED:
            return
        if self.state is State.CLOSED:
            return
        self.state = state
        self.why = why
        error = (
            self.ending()
            if self.ending is not None
            else (
                agent_unavailable(f"the sandbox's agent does not answer: {why}")
                if state is State.LOST
                else agent_restarted(f"the agent channel ended: {why}")
            )
        )
        self._fail_streams(error)
        self._decoder.scan_for(secrets.token_hex(16))  # nothing more is accepted
        self._settled.set()
        if state is State.LOST:
            log.warning("agent channel %s lost: %s", self.name, why)
        if notify and self._on_lost is not None:
            self._on_lost(self, why)

    def _fail_streams(self, error: SandboxError) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.fail(error)

    def _send_now(self, frame: bytes) -> None:
        try:
            self._writer.send_now(frame)
        except WriterOverflow as exc:
            self._end(State.LOST, str(exc))

    # ----- tasks ---------------------------------------------------------------------------

    async def _writer_task(self) -> None:
        try:
            await self._writer.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the pipe broke: nothing can be sent any more
            self._end(State.CLOSED, f"writing to the agent failed: {exc}")

    async def _read(self) -> None:
        try:
            while True:
                chunk = await self._transport.read()
                if chunk is None:
                    self._end(State.CLOSED, "the agent's output ended (the sandbox stopped?)")
                    return
                if self.state in (State.LOST, State.CLOSED):
                    continue  # read and dropped: a rescue begins a new epoch
                self._decoder.feed(chunk)
                self._drain()
                if self._pace is not None and (wait := self._pace(len(chunk))) > 0:
                    await pause(min(wait, MAX_PAUSE_S))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._end(State.CLOSED, f"reading from the agent failed: {exc}")

    def _drain(self) -> None:
        while True:
            try:
                frame = self._decoder.next()
                if frame is None:
                    return
                self._last_rx = time.monotonic()
                self._pinged = False
                if self.state is State.CONNECTING:
                    self._synced(frame)
                else:
                    self._dispatch(frame)
            except (FrameError, _EpochError) as exc:
                self._epoch_failed(str(exc))
            except StreamError as exc:  # a HELLO_OK with our nonce that is not valid JSON
                self._epoch_failed(str(exc))

    async def _keepalive(self) -> None:
        period = self._keepalive_s
        while True:
            await asyncio.sleep(period / 4)
            if self.state is not State.READY:
                continue
            silent = time.monotonic() - self._last_rx
            if silent > 2 * period:
                self._end(State.LOST, f"no keepalive for {silent:.1f} s")
            elif silent > period and not self._pinged:
                self._pinged = True
                self._send_now(frames.encode(FrameType.PING, 0, secrets.token_bytes(8)))

    # ----- dispatch ------------------------------------------------------------------------

    def _dispatch(self, frame: Frame) -> None:
        if frame.stream == 0:
            self._control(frame)
            return
        stream = self._streams.get(frame.stream)
        if stream is None:
            self._unknown_stream(frame)
            return
        try:
            deliver(stream, frame)
        except StreamError as exc:
            stream.fail(protocol_error(f"the agent broke the protocol on its stream: {exc}"))
            self._send_now(frames.reset(stream.id, exc.code, str(exc)))
        if stream.ended and self._streams.get(stream.id) is stream:
            del self._streams[stream.id]

    def _control(self, frame: Frame) -> None:
        match frame.type:
            case FrameType.PING:
                self._send_now(frames.encode(FrameType.PONG, 0, frame.payload[:64]))
            case FrameType.PONG:
                pass
            case FrameType.HELLO_OK:
                try:
                    nonce = frames.parse_json(frame).get("nonce")
                except StreamError as exc:
                    raise _EpochError(str(exc)) from None
                if nonce != self._nonce:  # the answer to a resent HELLO carries ours
                    raise _EpochError("a HELLO_OK with another nonce")
            case FrameType.GOAWAY:
                text = frame.payload[:300].decode(errors="replace")
                raise _EpochError(f"the agent ended the epoch: {text}")
            case _:
                raise _EpochError(f"frame type {frame.type:#x} on the control stream")

    def _unknown_stream(self, frame: Frame) -> None:
        sid = frame.stream
        if frame.type == FrameType.RESET:
            return  # never answer a RESET with a RESET
        if sid % 2 == 1 and sid < self._next_id:
            return  # a stream we ended: what the agent sent before it saw our RESET
        if sid % 2 == 0 and frame.type != FrameType.OPEN and sid <= self._peer_last_id:
            return  # an agent stream we refused: what it sent before it saw our RESET
        if sid % 2 == 0 and frame.type == FrameType.OPEN:
            if sid <= self._peer_last_id:
                self._send_now(frames.reset(sid, "PROTOCOL", f"stream {sid} opened twice"))
                return
            self._peer_last_id = sid
            self._peer_open(sid, frame)
            return
        log.debug(
            "agent channel %s: frame %#x on stream %d it was never given",
            self.name,
            frame.type,
            sid,
        )
        self._send_now(frames.reset(sid, "PROTOCOL", f"stream {sid} is not open"))

    def _peer_open(self, sid: int, frame: Frame) -> None:
        if self._on_peer_open is None:
            self.refuse(sid, "REFUSED", "no egress over this channel")
            return
        try:
            doc = frames.parse_json(frame)
        except StreamError as exc:
            self.refuse(sid, "PROTOCOL", str(exc))
            return
        self._on_peer_open(self, sid, doc)

    def accept(self, stream_id: int, kind: str, cls: type[S]) -> S:
        """Serve a stream the agent opened (OPEN_OK); its frames go to the new stream."""
        stream = cls(
            stream_id,
            kind,
            window=self._window,
            window_max=self._window_max,
            send=self._writer.send,
            send_now=self._send_now,
            fds=frozenset({0}),
        )
        stream.opened.set_result({})
        self._streams[stream_id] = stream
        self._send_now(frames.encode_json(FrameType.OPEN_OK, stream_id, {}))
        return stream

    def refuse(self, stream_id: int, error: str, message: str) -> None:
        """Answer a stream the agent opened with RESET."""
        self._send_now(frames.reset(stream_id, error, message[:500]))


__all__ = ["Channel", "Hello", "PeerOpen", "State", "pause"]
