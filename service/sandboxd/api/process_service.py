"""ProcessService: Exec streams events as they happen; Run collects them."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from sandboxd.api import convert
from sandboxd.api.errors import Ctx, stream, unary
from sandboxd.config import Config
from sandboxd.execution import ExecRequestInput, Executor, prepare
from sandboxd.models import ExecExited, ExecOutput, ExecStarted, OutputStream
from sandboxd.sessions import SessionManager
from sandboxd.v1 import process_pb2, process_pb2_grpc


def _exec_input(req: process_pb2.ExecRequest | process_pb2.RunRequest) -> ExecRequestInput:
    """ExecRequest and RunRequest share these fields."""
    return ExecRequestInput(
        argv=list(req.argv),
        cwd=req.cwd,
        env=dict(req.env),
        stdin=req.stdin,
        timeout_s=convert.optional_duration_s(req.timeout, req.HasField("timeout")),
        max_output_bytes=req.max_output_bytes or None,
    )


class ProcessService(process_pb2_grpc.ProcessServiceServicer):
    def __init__(self, sessions: SessionManager, executor: Executor, config: Config) -> None:
        self._sessions = sessions
        self._executor = executor
        self._config = config

    @stream
    async def Exec(
        self, request: process_pb2.ExecRequest, context: Ctx
    ) -> AsyncGenerator[process_pb2.ExecResponse, None]:
        async with self._sessions.use(request.session_id) as session:
            spec = prepare(session, _exec_input(request), self._config.max_limits)
            async for event in self._executor.stream(session, spec):
                yield convert.exec_response(event)

    @unary
    async def Run(self, request: process_pb2.RunRequest, context: Ctx) -> process_pb2.RunResponse:
        out = {OutputStream.STDOUT: bytearray(), OutputStream.STDERR: bytearray()}
        response = process_pb2.RunResponse()
        async with self._sessions.use(request.session_id) as session:
            spec = prepare(session, _exec_input(request), self._config.max_limits)
            async for event in self._executor.stream(session, spec):
                match event:
                    case ExecStarted(process_id=pid):
                        response.process_id = pid
                    case ExecOutput(stream=s, data=data):
                        out[s] += data
                    case ExecExited():
                        response.exit_code = event.exit_code
                        response.signal = event.signal
                        response.timed_out = event.timed_out
                        response.truncated = event.truncated
                        response.duration.CopyFrom(convert.duration_pb(event.duration_s))
        response.stdout = bytes(out[OutputStream.STDOUT])
        response.stderr = bytes(out[OutputStream.STDERR])
        return response
