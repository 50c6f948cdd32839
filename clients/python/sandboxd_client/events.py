"""Process results and stream events: what Exec, Interact, Attach, Run and StartProcess give."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any, Literal, Self

from sandboxd_client._convert import enum_name, seconds, timestamp
from sandboxd_client._gen.sandboxd.v1 import process_pb2

Stream = Literal["stdout", "stderr"]


@dataclasses.dataclass(frozen=True)
class Started:
    """The command has started."""

    process_id: str
    kind_name = "started"


@dataclasses.dataclass(frozen=True)
class Output:
    """A chunk of the command's output; `offset` is its byte position within its stream."""

    stream: Stream
    data: bytes
    offset: int
    kind_name = "output"


@dataclasses.dataclass(frozen=True)
class Exited:
    """Always the last event. A timeout, a cap or a kill is reported here, not raised."""

    exit_code: int
    signal: str = ""
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0
    kind_name = "exited"

    @classmethod
    def from_pb(cls, m: process_pb2.ProcessExited) -> Self:
        return cls(m.exit_code, m.signal, m.timed_out, m.truncated, seconds(m.duration))


@dataclasses.dataclass(frozen=True)
class Keepalive:
    """The server's sign of life on a quiet stream (only yielded when asked for)."""

    kind_name = "keepalive"


@dataclasses.dataclass(frozen=True)
class OutputGap:
    """Output an attach asked for that the server no longer holds (its buffer moved on)."""

    stream: Stream
    offset: int
    length: int
    kind_name = "gap"


Event = Started | Output | Exited | Keepalive | OutputGap


def stream_name(value: int) -> Stream:
    return "stderr" if value == process_pb2.OUTPUT_STREAM_STDERR else "stdout"


def event_from_pb(
    resp: process_pb2.ExecResponse
    | process_pb2.InteractResponse
    | process_pb2.AttachProcessResponse,
) -> Event | None:
    kind = resp.WhichOneof("event")
    if kind == "started":
        return Started(resp.started.process_id)
    if kind == "output":
        return Output(stream_name(resp.output.stream), resp.output.data, resp.output.offset)
    if kind == "exited":
        return Exited.from_pb(resp.exited)
    if kind == "keepalive":
        return Keepalive()
    if kind == "gap" and isinstance(resp, process_pb2.AttachProcessResponse):
        return OutputGap(stream_name(resp.gap.stream), resp.gap.offset, resp.gap.length)
    return None  # an event kind newer than this client: skipped


async def events_of(responses: AsyncIterator[Any], keepalives: bool) -> AsyncIterator[Event]:
    """The events of an Exec/Interact/Attach stream; keepalives only when asked for."""
    async for resp in responses:
        event = event_from_pb(resp)
        if event is None or (isinstance(event, Keepalive) and not keepalives):
            continue
        yield event


@dataclasses.dataclass(frozen=True)
class RunResult:
    """A command's collected result."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    truncated: bool = False
    signal: str = ""
    duration: float = 0.0
    process_id: str = ""
    # Filled when run(..., text=True) asked for OUTPUT_ENCODING_UTF8_LOSSY.
    stdout_text: str = ""
    stderr_text: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.truncated

    @classmethod
    def from_pb(cls, r: process_pb2.RunResponse) -> Self:
        return cls(
            r.exit_code,
            r.stdout,
            r.stderr,
            r.timed_out,
            r.truncated,
            r.signal,
            seconds(r.duration),
            r.process_id,
            r.stdout_text,
            r.stderr_text,
        )


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """A background process (StartProcess); output offsets say what attach can replay."""

    process_id: str
    session_id: str
    argv: tuple[str, ...]
    cwd: str
    state: str  # RUNNING, EXITED
    started_at: dt.datetime | None
    exited: Exited | None
    stdout_bytes: int
    stderr_bytes: int
    stdout_first_offset: int
    stderr_first_offset: int
    origin: str = "START_PROCESS"  # or EXEC, RUN, INTERACT (GetProcess)
    stdin_open: bool = False  # send_input still takes more

    @classmethod
    def from_pb(cls, m: process_pb2.Process) -> Self:
        return cls(
            m.process_id,
            m.session_id,
            tuple(m.argv),
            m.cwd,
            enum_name(process_pb2.ProcessState, m.state, "PROCESS_STATE_"),
            timestamp(m, "started_at"),
            Exited.from_pb(m.exited) if m.HasField("exited") else None,
            m.stdout_bytes,
            m.stderr_bytes,
            m.stdout_first_offset,
            m.stderr_first_offset,
            # A server from before GetProcess knew only background processes.
            enum_name(process_pb2.ProcessOrigin, m.origin or 1, "PROCESS_ORIGIN_"),
            m.stdin_open,
        )
