"""What a channel is in (`State`), what the agent said when it answered (`Hello`), and how
a frame of an open stream reaches the stream (`deliver`): the channel's parts that hold no
task and no pipe (agent/channel.py runs them)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from sandboxd.agent import frames
from sandboxd.agent.frames import Frame, FrameType, StreamError
from sandboxd.agent.streams import AgentStream


class State(enum.Enum):
    CONNECTING = "connecting"
    READY = "ready"
    LOST = "lost"  # the agent does not answer; the owner rescues it
    CLOSED = "closed"  # the pipe ended or the channel was closed


@dataclass(frozen=True)
class Hello:
    """What the agent said in HELLO_OK."""

    instance: str = ""
    pid: int = 0
    processes: list[dict[str, Any]] = field(default_factory=list)


def deliver(stream: AgentStream, frame: Frame) -> None:
    """Hand one frame of an open stream to it; a frame its rules forbid is StreamError."""
    match frame.type:
        case FrameType.OPEN_OK:
            stream.on_open_ok(frames.parse_json(frame))
        case FrameType.DATA:
            stream.on_data(frames.parse_fd(frame), frame.payload[1:])
        case FrameType.EOF:
            if len(frame.payload) != 1:
                raise StreamError("EOF payload is not one fd byte")
            stream.on_eof(frame.payload[0])
        case FrameType.WINDOW:
            stream.on_window(frames.parse_u32(frame))
        case FrameType.EXIT:
            stream.on_exit(frames.parse_json(frame))
        case FrameType.RESET:
            try:
                doc = frames.parse_json(frame)
            except StreamError:
                doc = {"error": "PROTOCOL", "message": "a RESET that is not JSON"}
            stream.on_reset(doc)
        case FrameType.CLOSE:
            stream.on_close()
        case FrameType.OPEN:
            raise StreamError(f"stream {stream.id} opened twice")
        case _:
            raise StreamError(f"frame type {frame.type:#x} is not one the agent may send here")
