"""ProcessService: Exec streams events as they happen; Run collects them; Interact drives a
running command; StartProcess/AttachProcess/ListProcesses/SignalProcess serve background
processes. Each method only translates; the work is in execution, interactive, processes."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import TypeVar

from sandboxd import interactive, validation
from sandboxd.api import convert, replies
from sandboxd.api.errors import Ctx, stream, unary
from sandboxd.api.pb_time import duration_pb
from sandboxd.config import Config
from sandboxd.errors import InvalidArgument, ResourceExhausted
from sandboxd.exec_spec import ExecRequestInput, PtySize, prepare
from sandboxd.execution import Executor
from sandboxd.models import (
    ExecExited,
    ExecKeepalive,
    ExecOutput,
    ExecSpec,
    ExecStarted,
    OutputStream,
    Session,
)
from sandboxd.processes import (
    AttachEvent,
    BackgroundProcess,
    OutputGap,
    ProcessManager,
    ProcessOrigin,
    StartOptions,
)
from sandboxd.reasons import Reason
from sandboxd.request_ids import validate_request_id
from sandboxd.sessions import SessionManager
from sandboxd.v1 import process_pb2, process_pb2_grpc

_Request = process_pb2.ExecRequest | process_pb2.RunRequest | process_pb2.StartProcessRequest
_EventResponse = TypeVar(
    "_EventResponse",
    process_pb2.ExecResponse,
    process_pb2.InteractResponse,
    process_pb2.AttachProcessResponse,
)


# The encodings a Run may ask for: protobuf's `values()` builds a new list at every call.
_OUTPUT_ENCODINGS = frozenset(process_pb2.OutputEncoding.values())


def _exec_input(req: _Request) -> ExecRequestInput:
    """ExecRequest, RunRequest and StartProcessRequest share these fields."""
    return ExecRequestInput(
        argv=list(req.argv),
        cwd=req.cwd,
        env=dict(req.env),
        stdin=req.stdin,
        timeout_s=convert.optional_duration_s(req.timeout, req.HasField("timeout")),
        max_output_bytes=req.max_output_bytes or None,
    )


def _fill_text(response: process_pb2.RunResponse, lossy: bool) -> None:
    """stdout_text/stderr_text for OUTPUT_ENCODING_UTF8_LOSSY (a cut may split a character:
    its bytes become U+FFFD like any invalid byte); they count toward the reply's size."""
    if lossy:
        response.stdout_text = response.stdout.decode("utf-8", errors="replace")
        response.stderr_text = response.stderr.decode("utf-8", errors="replace")


def _event_pb(event: AttachEvent, cls: type[_EventResponse]) -> _EventResponse:
    """One process event as ExecResponse, InteractResponse or AttachProcessResponse."""
    match event:
        case ExecStarted(process_id=pid):
            return cls(started=process_pb2.ProcessStarted(process_id=pid))
        case ExecOutput(stream=s, data=data, offset=offset):
            # Filled in place: a submessage passed as a keyword is merged into the reply, which
            # copies its data again (about 130 us per 64 KiB chunk, against 5 in place).
            response = cls()
            output = response.output
            output.stream = process_pb2.OutputStream.ValueType(s.value)
            output.data = data
            output.offset = offset
            return response
        case ExecExited():
            return cls(exited=convert.exited_pb(event))
        case ExecKeepalive():
            return cls(keepalive=process_pb2.Keepalive())
        case OutputGap(stream=s, offset=offset, length=length):
            assert cls is process_pb2.AttachProcessResponse, "gaps only come from AttachProcess"
            return cls(
                gap=process_pb2.OutputGap(
                    stream=process_pb2.OutputStream.ValueType(s.value),
                    offset=offset,
                    length=length,
                )
            )
    raise TypeError(f"unknown event {event!r}")


def _process_pb(p: BackgroundProcess) -> process_pb2.Process:
    out, err = OutputStream.STDOUT, OutputStream.STDERR
    pb = process_pb2.Process(
        process_id=p.process_id,
        session_id=p.session_id,
        argv=p.spec.argv,
        cwd=p.spec.cwd,
        state=process_pb2.PROCESS_STATE_EXITED
        if p.exited is not None
        else process_pb2.PROCESS_STATE_RUNNING,
        stdout_bytes=p.end(out),
        stderr_bytes=p.end(err),
        stdout_first_offset=p.first_offset(out),
        stderr_first_offset=p.first_offset(err),
        origin=process_pb2.ProcessOrigin.ValueType(p.origin.value),
        stdin_open=p.command is not None and not p.command.stdin_closed,
    )
    pb.started_at.FromDatetime(p.started_at)
    if p.exited is not None:
        pb.exited.CopyFrom(convert.exited_pb(p.exited))
    return pb


def _request_process_id(request_id: str) -> str:
    """A retry with one request_id names one process: the id is derived from it, so the
    idempotent start by process_id applies (same command: the same process)."""
    if not request_id:
        return ""
    rid = validate_request_id(request_id)
    return "r-" + hashlib.sha256(rid.encode()).hexdigest()[:32]


def _process_key(p: BackgroundProcess) -> str:
    """Start order (the order ListProcesses always had), unique by the id."""
    return f"{p.started_at.isoformat()} {p.process_id}"


def _idle_timeout_s(start: process_pb2.InteractStart, default_s: float, max_s: float) -> float:
    if not start.HasField("idle_timeout"):
        return default_s
    asked = convert.optional_duration_s(start.idle_timeout, True)
    if asked is None or asked <= 0:
        return default_s
    if asked > max_s:
        raise InvalidArgument(
            f"idle_timeout of {asked:g} s is above the server maximum of {max_s:g} s (lease_max_s)",
            reason=Reason.LIMIT_EXCEEDS_MAXIMUM,
            metadata={"limit": "idle_timeout", "maximum": f"{max_s:g}s"},
        )
    return asked


def _first_message_error(what: str) -> InvalidArgument:
    return InvalidArgument(
        f"the first Interact message must be `start` (got {what})",
        reason=Reason.INVALID_FIRST_MESSAGE,
    )


async def _controls(
    requests: AsyncIterator[process_pb2.InteractRequest],
) -> AsyncIterator[interactive.Control]:
    async for req in requests:
        match req.WhichOneof("action"):
            case "stdin":
                yield interactive.StdinData(req.stdin.data)
            case "close_stdin":
                yield interactive.CloseStdin()
            case "signal":
                yield interactive.SendSignal(
                    convert.signal_name(req.signal.signal, req.signal.signal_value)
                )
            case "resize":
                yield interactive.Resize(req.resize.rows, req.resize.cols)
            case "start":
                raise InvalidArgument(
                    "`start` may only be the first Interact message",
                    reason=Reason.INVALID_INTERACT_MESSAGE,
                )
            case _:
                raise InvalidArgument(
                    "an Interact message with no action set", reason=Reason.INVALID_INTERACT_MESSAGE
                )


class ProcessService(process_pb2_grpc.ProcessServiceServicer):
    def __init__(
        self,
        sessions: SessionManager,
        executor: Executor,
        config: Config,
        processes: ProcessManager,
    ) -> None:
        self._sessions = sessions
        self._executor = executor
        self._config = config
        self._processes = processes

    @stream
    async def Exec(
        self, request: process_pb2.ExecRequest, context: Ctx
    ) -> AsyncGenerator[process_pb2.ExecResponse, None]:
        async with self._sessions.use_for_command(request.session_id) as session:
            spec = prepare(session, _exec_input(request), self._config.limits.max)
            events = self._executor.stream(
                session, spec, keepalive_s=self._config.server.keepalive_interval_s
            )
            tracked = self._processes.track(session.session_id, spec, ProcessOrigin.EXEC, events)
            async for event in tracked:
                yield _event_pb(event, process_pb2.ExecResponse)

    @unary
    async def Run(self, request: process_pb2.RunRequest, context: Ctx) -> process_pb2.RunResponse:
        """Collects the output into one reply of at most the caller's limit (max_reply_bytes,
        else 4 MiB): what would not fit is dropped (the command runs on to its end) and
        `truncated` set, so the exit status always arrives."""
        if request.output_encoding not in _OUTPUT_ENCODINGS:
            raise InvalidArgument(
                f"unknown output_encoding {request.output_encoding}", reason=Reason.INVALID_ARGUMENT
            )
        limit = replies.current()
        out = {OutputStream.STDOUT: bytearray(), OutputStream.STDERR: bytearray()}
        room = limit  # stdout and stderr together; the rest of the reply is measured at the end
        cut = False
        response = process_pb2.RunResponse()
        async with self._sessions.use_for_command(request.session_id) as session:
            spec = prepare(session, _exec_input(request), self._config.limits.max)
            events = self._executor.stream(session, spec)
            tracked = self._processes.track(session.session_id, spec, ProcessOrigin.RUN, events)
            async for event in tracked:
                match event:
                    case ExecStarted(process_id=pid):
                        response.process_id = pid
                    case ExecOutput(stream=s, data=data):
                        if len(data) > room:
                            data, cut = data[:room], True
                        out[s] += data
                        room -= len(data)
                    case ExecExited():
                        response.exit_code = event.exit_code
                        response.signal = event.signal
                        response.timed_out = event.timed_out
                        response.truncated = event.truncated
                        response.duration.CopyFrom(duration_pb(event.duration_s))
        response.stdout = bytes(out[OutputStream.STDOUT])
        response.stderr = bytes(out[OutputStream.STDERR])
        lossy = request.output_encoding == process_pb2.OUTPUT_ENCODING_UTF8_LOSSY
        _fill_text(response, lossy)
        if cut or response.ByteSize() > limit:
            response.truncated = True  # set before the fit measures the reply: it counts too
        replies.cut_to_fit(response, ("stdout", "stderr"), limit, lambda r: _fill_text(r, lossy))
        return response

    @stream
    async def Interact(
        self, request: AsyncIterator[process_pb2.InteractRequest], context: Ctx
    ) -> AsyncGenerator[process_pb2.InteractResponse, None]:
        requests = aiter(request)
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            raise _first_message_error("no message") from None
        action = first.WhichOneof("action")
        if action != "start":
            raise _first_message_error(f"`{action}`" if action else "an empty message")
        start = first.start
        pty = PtySize(start.pty.rows, start.pty.cols) if start.HasField("pty") else None
        lease_max_s = self._config.leases.max_s
        idle_s = _idle_timeout_s(start, self._config.server.interact_idle_timeout_s, lease_max_s)
        async with self._sessions.use_for_command(start.request.session_id) as session:
            spec = prepare(
                session,
                _exec_input(start.request),
                self._config.limits.max,
                interactive_s=min(lease_max_s, validation.MAX_SPAN_S),
            )
            events = interactive.interact(
                self._executor,
                session,
                spec,
                pty,
                _controls(requests),
                self._config.server.keepalive_interval_s,
                idle_s,
            )
            tracked = self._processes.track(
                session.session_id, spec, ProcessOrigin.INTERACT, events, pty=pty is not None
            )
            async for event in tracked:
                yield _event_pb(event, process_pb2.InteractResponse)

    @unary
    async def StartProcess(
        self, request: process_pb2.StartProcessRequest, context: Ctx
    ) -> process_pb2.StartProcessResponse:
        async with self._sessions.use(request.session_id) as session:
            spec, options = self._start_spec(session, request)
            # The process holds one of the tenant's exec slots until it ends.
            slot = self._sessions.exec_slots.slot()
            pid = request.process_id or _request_process_id(request.request_id)
            proc = await self._processes.start(
                session, spec, pid, slot, options, request_id=request.request_id
            )
        return process_pb2.StartProcessResponse(process=_process_pb(proc))

    def _start_spec(
        self, session: Session, request: process_pb2.StartProcessRequest
    ) -> tuple[ExecSpec, StartOptions]:
        """Without output_buffer_bytes, max_output_bytes is the ring size (its deprecated
        meaning) and output is never cut; with it, max_output_bytes is the cap, as for Exec."""
        inp = _exec_input(request)
        if request.output_buffer_bytes == 0:
            spec = prepare(session, inp, self._config.limits.max)
            return spec, StartOptions(spec.max_output_bytes, False, request.keep_stdin_open)
        ring = prepare(
            session,
            dataclasses.replace(inp, max_output_bytes=request.output_buffer_bytes),
            self._config.limits.max,
        ).max_output_bytes
        spec = prepare(session, inp, self._config.limits.max)
        return spec, StartOptions(ring, True, request.keep_stdin_open)

    @stream
    async def AttachProcess(
        self, request: process_pb2.AttachProcessRequest, context: Ctx
    ) -> AsyncGenerator[process_pb2.AttachProcessResponse, None]:
        async with self._sessions.use(request.session_id) as session:
            await self._processes.adopted(session.session_id)
            proc = self._processes.get(session.session_id, request.process_id)
        events = self._processes.follow(
            proc,
            request.stdout_offset,
            request.stderr_offset,
            self._config.server.keepalive_interval_s,
        )
        async for event in events:
            yield _event_pb(event, process_pb2.AttachProcessResponse)

    @unary
    async def ListProcesses(
        self, request: process_pb2.ListProcessesRequest, context: Ctx
    ) -> process_pb2.ListProcessesResponse:
        async with self._sessions.use(request.session_id) as session:
            await self._processes.adopted(session.session_id)
            procs = self._processes.list(session.session_id)
        bound = f"processes {session.session_id}"

        def reply(
            chosen: Sequence[BackgroundProcess], token: str
        ) -> process_pb2.ListProcessesResponse:
            return process_pb2.ListProcessesResponse(
                processes=[_process_pb(p) for p in chosen], next_page_token=token
            )

        def whole(size: int, limit: int) -> ResourceExhausted:
            return replies.too_large(
                "the list of every process", size, limit, "ask for pages (page_size)"
            )

        # In start order already (the processes' own order): no sort before a page.
        return await replies.held_page(
            procs, _process_key, request, bound, reply, "processes", whole, sort=False
        )

    @unary
    async def SignalProcess(
        self, request: process_pb2.SignalProcessRequest, context: Ctx
    ) -> process_pb2.SignalProcessResponse:
        async with self._sessions.use(request.session_id) as session:
            name = convert.signal_name(request.signal, request.signal_value)
            await self._processes.signal(session, request.process_id, name)
        return process_pb2.SignalProcessResponse()

    @unary
    async def GetProcess(
        self, request: process_pb2.GetProcessRequest, context: Ctx
    ) -> process_pb2.GetProcessResponse:
        async with self._sessions.use(request.session_id) as session:
            await self._processes.adopted(session.session_id)
            proc = self._processes.get(session.session_id, request.process_id)
        return process_pb2.GetProcessResponse(process=_process_pb(proc))

    @unary
    async def SendProcessInput(
        self, request: process_pb2.SendProcessInputRequest, context: Ctx
    ) -> process_pb2.SendProcessInputResponse:
        async with self._sessions.use(request.session_id) as session:
            await self._processes.adopted(session.session_id)
            await self._processes.send_input(session.session_id, request.process_id, request.data)
        return process_pb2.SendProcessInputResponse()

    @unary
    async def CloseProcessStdin(
        self, request: process_pb2.CloseProcessStdinRequest, context: Ctx
    ) -> process_pb2.CloseProcessStdinResponse:
        async with self._sessions.use(request.session_id) as session:
            await self._processes.adopted(session.session_id)
            await self._processes.close_stdin(session.session_id, request.process_id)
        return process_pb2.CloseProcessStdinResponse()
