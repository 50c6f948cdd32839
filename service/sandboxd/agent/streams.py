"""One stream of the agent channel: its inbound buffer bounded by the window it granted, its
outbound window, and how it ends (EXIT, CLOSE, RESET, or the epoch's end).

The inbound window tunes itself (`window_max` above `window`): a stream whose reader keeps up
and whose half window was consumed within `GROW_WITHIN_S` of the previous grant is latency-bound
(the agent waits for WINDOW through docker attach), so that grant also doubles the window, up to
`window_max`. A stream with a slow or stalled reader sends no grant, or grants with its buffer
still full, and so keeps its window: what waits unread in the server is at most the stream's
current window, never more than `window_max`.

The channel's reader calls the `on_*` methods (never blocking: they only append and signal);
the stream's user calls `read`/`write`. The reader raises `StreamError` for a frame that breaks
this stream's rules, and the channel answers it with RESET on this stream only.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

from sandboxd.agent import frames
from sandboxd.agent.frames import StreamError
from sandboxd.errors import (
    FailedPrecondition,
    Internal,
    NotFound,
    ResourceExhausted,
    SandboxError,
    Unavailable,
)
from sandboxd.reasons import Reason

SendNow = Callable[[bytes], None]
Send = Callable[[bytes], Any]  # an awaitable sender (FrameWriter.send)

# A half window consumed within this of the previous grant, by a reader that kept up, grows the
# window: the stream moves at least half a window per this time, which a window round trip
# through docker attach (milliseconds) would otherwise throttle; an interactive or trickling
# stream never grants that often and keeps the configured window.
GROW_WITHIN_S = 0.05
# The most one write hands the channel's writer at once: the size of the writer's batch.
SEND_RUN = 256 * 1024


def agent_restarted(what: str) -> Unavailable:
    return Unavailable(what, reason=Reason.AGENT_RESTARTED)


def agent_unavailable(what: str) -> Unavailable:
    return Unavailable(what, reason=Reason.AGENT_UNAVAILABLE)


def protocol_error(what: str) -> Internal:
    return Internal(what, reason=Reason.AGENT_PROTOCOL_ERROR)


class AgentStream:
    """A stream the server opened (odd id)."""

    def __init__(
        self,
        stream_id: int,
        kind: str,
        *,
        window: int,
        send: Send,
        send_now: SendNow,
        fds: frozenset[int] = frozenset({1, 2}),
        window_max: int = 0,
    ) -> None:
        self.id = stream_id
        self.kind = kind
        self._window = window  # what the agent may have sent us unread (grows to window_max)
        self._window_max = max(window, window_max)
        self._granted_at = time.monotonic()
        self._send = send
        self._send_now = send_now
        self._fds = fds
        self.opened: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._chunks: collections.deque[tuple[int, bytes]] = collections.deque()
        self._arrived = asyncio.Event()
        self._credit = window  # what the agent may still send us
        self._consumed = 0  # read since the last WINDOW we sent
        self._send_window = window
        self._window_grew = asyncio.Event()
        self._eof: set[int] = set()
        self._sent_eof: set[int] = set()
        self.exit: dict[str, Any] | None = None
        self.ended = False  # no more frames will come (EXIT, CLOSE, RESET, epoch end)
        self.error: SandboxError | None = None
        self.reset_by_us = False
        self.reset_name = ""  # the agent's RESET error, when it reset the stream
        self.done = asyncio.Event()

    # ----- the reader's side ---------------------------------------------------------------

    def on_open_ok(self, doc: dict[str, Any]) -> None:
        if self.opened.done():
            raise StreamError("OPEN_OK twice")
        self.opened.set_result(doc)

    def _require_open(self, what: str) -> None:
        if not self.opened.done():
            raise StreamError(f"{what} before OPEN_OK")

    def on_data(self, fd: int, chunk: bytes) -> None:
        self._require_open("DATA")
        if fd not in self._fds:
            raise StreamError(f"DATA on fd {fd}")
        if fd in self._eof:
            raise StreamError(f"DATA on fd {fd} after its EOF")
        if len(chunk) > self._credit:
            raise StreamError(
                f"{len(chunk)} bytes of DATA with a window of {self._credit}", "FLOW_CONTROL"
            )
        self._credit -= len(chunk)
        if chunk:
            self._chunks.append((fd, chunk))
            self._arrived.set()

    def on_eof(self, fd: int) -> None:
        self._require_open("EOF")
        if fd not in self._fds or fd in self._eof:
            raise StreamError(f"EOF on fd {fd} (unknown or twice)")
        self._eof.add(fd)

    def on_window(self, increment: int) -> None:
        self._require_open("WINDOW")
        if increment <= 0 or self._send_window + increment > frames.MAX_WINDOW:
            raise StreamError(f"WINDOW increment {increment}", "FLOW_CONTROL")
        self._send_window += increment
        self._window_grew.set()

    def on_exit(self, doc: dict[str, Any]) -> None:
        self._require_open("EXIT")
        code, sig = doc.get("exit_code"), doc.get("signal")
        if not isinstance(code, int) or not (sig is None or isinstance(sig, int)):
            raise StreamError(f"EXIT without an integer exit_code: {str(doc)[:200]}")
        self.exit = {"exit_code": code, "signal": sig}
        self._end()

    def on_close(self) -> None:
        self._require_open("CLOSE")
        self._end()

    def on_reset(self, doc: dict[str, Any]) -> None:
        name = str(doc.get("error", "UNKNOWN"))[:64]
        message = str(doc.get("message", ""))[:500]
        self.reset_name = name
        err: SandboxError = protocol_error(
            f"the agent reset the {self.kind} stream: {name}: {message}"
        )
        if name == "MEMORY":  # its input would pass the agent's memory budget (docs/agent.md)
            err = ResourceExhausted(f"the agent ended the {self.kind} stream: {message}")
        if name == "GONE":  # the server forgot the detached process while this read it
            err = NotFound(
                "the process's record went while it was read (the session's records made "
                f"room for newer processes), and its output with it: {message}",
                reason=Reason.PROCESS_NOT_FOUND,
            )
        if not self.opened.done():
            err = open_refused(self.kind, name, message)
        self.fail(err)

    def fail(self, error: SandboxError) -> None:
        """End the stream with `error` (its reader sees it after the data already arrived)."""
        if self.ended:
            return
        self.error = error
        if not self.opened.done():
            self.opened.set_exception(error)
            self.opened.exception()  # retrieved: an opener that went away logs nothing
        self._end()

    def _end(self) -> None:
        self.ended = True
        self.done.set()
        self._arrived.set()
        self._window_grew.set()

    # ----- the user's side -----------------------------------------------------------------

    async def read(self) -> tuple[int, bytes] | None:
        """Next (fd, bytes); None once the stream ended cleanly; its error if it did not."""
        while not self._chunks:
            if self.ended:
                if self.error is not None:
                    raise self.error
                return None
            self._arrived.clear()
            await self._arrived.wait()
        fd, chunk = self._chunks.popleft()
        self._consumed_bytes(len(chunk))
        return fd, chunk

    def read_ready(self, fd: int, limit: int) -> list[bytes]:
        """Chunks of `fd` already arrived at the head of the buffer, up to about `limit`."""
        parts: list[bytes] = []
        size = 0
        while self._chunks and self._chunks[0][0] == fd and size < limit:
            chunk = self._chunks.popleft()[1]
            parts.append(chunk)
            size += len(chunk)
            self._consumed_bytes(len(chunk))
        return parts

    def _consumed_bytes(self, n: int) -> None:
        self._consumed += n
        if self._consumed >= self._window // 2 and not self.ended:
            consumed, self._consumed = self._consumed, 0
            self._grant_back(consumed)

    def _grant_back(self, consumed: int) -> None:
        """WINDOW for `consumed` bytes, plus the window's growth when the reader keeps up: it
        holds at most a quarter of the window unread, and consumed this half window within
        GROW_WITHIN_S of the previous grant (the agent waited on credit, not on the reader)."""
        now = time.monotonic()
        unread = self._window - self._credit - consumed  # arrived, not yet consumed
        increment = consumed
        if (
            self._window < self._window_max
            and unread <= self._window // 4
            and now - self._granted_at <= GROW_WITHIN_S
        ):
            grown = min(self._window * 2, self._window_max)
            increment += grown - self._window
            self._window = grown
        self._granted_at = now
        self._credit += increment
        self._send_now(frames.window(self.id, increment))

    async def write(self, fd: int, data: bytes) -> None:
        """DATA on `fd`, as much as the agent's window allows at a time: the frames of up to
        SEND_RUN bytes go to the writer as one item (frames.data_run)."""
        view = memoryview(data)
        while view:
            while self._send_window <= 0 and not self.ended:
                self._window_grew.clear()
                await self._window_grew.wait()
            if self.ended:
                raise self.error or ConnectionError("the stream has ended")
            n = min(len(view), self._send_window, SEND_RUN)
            self._send_window -= n
            await self._send(frames.data_run(self.id, fd, view[:n]))
            view = view[n:]

    def eof_sent(self, fds: tuple[int, ...]) -> None:
        """The EOF of `fds` went with the OPEN (Channel.open): `send_eof` of them is a no-op."""
        self._sent_eof.update(fds)

    def send_eof(self, fd: int) -> None:
        if fd in self._sent_eof or self.ended:
            return
        self._sent_eof.add(fd)
        self._send_now(frames.eof(self.id, fd))

    def send_control(self, frame: bytes) -> None:
        if not self.ended:
            self._send_now(frame)

    def reset(self, error: str = "CANCELLED", message: str = "") -> None:
        """End the stream from our side (the agent ends a non-detached command at once)."""
        if self.ended:
            return
        self.reset_by_us = True
        self._send_now(frames.reset(self.id, error, message))
        self.fail(Internal(f"the {self.kind} stream was closed by the server ({error})"))


_OPEN_ERRORS = {
    "NOT_FOUND": "the command was not found in the sandbox",
    "PERMISSION_DENIED": "the command may not be run (permission denied)",
    "CWD": "the working directory is not usable",
    "RESOURCE": "the sandbox could not start another process (fork failed)",
    "INVALID": "the agent refused the request as invalid",
    "LIMIT": "the sandbox has no room for another command",
}


def open_refused(kind: str, name: str, message: str) -> SandboxError:
    said = f"{_OPEN_ERRORS.get(name, 'the agent refused it')}: {message}" if message else ""
    text = f"the agent did not open the {kind}: {said or name}"
    match name:
        case "NOT_FOUND":
            return NotFound(text)
        case "RESOURCE":
            return ResourceExhausted(text)
        case "LIMIT":  # the agent's guard under gVisor (helper/agent_guard.c)
            return ResourceExhausted(text, reason=Reason.SANDBOX_LIMIT_REACHED)
        case "PERMISSION_DENIED" | "CWD":
            return FailedPrecondition(text)
        case "PROTOCOL" | "FLOW_CONTROL":
            return protocol_error(text)
        case _:
            return Internal(text)
