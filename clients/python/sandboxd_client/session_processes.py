"""Session calls on processes: a command streamed (Exec), collected (Run) or interactive
(Interact); background processes (StartProcess, AttachProcess, ListProcesses, SignalProcess);
and any process by handle (GetProcess) with more stdin for it (SendProcessInput,
CloseProcessStdin).

A mixin of `Session`, kept apart so session.py stays one screenful per concern.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandboxd_client._convert import duration
from sandboxd_client._gen.sandboxd.v1 import process_pb2
from sandboxd_client._rpc import UNSET, rpc
from sandboxd_client.events import Event, ProcessInfo, RunResult, events_of
from sandboxd_client.interaction import Interaction

if TYPE_CHECKING:
    from sandboxd_client.client import SandboxClient


def _exec_fields(
    session_id: str,
    argv: Sequence[str],
    cwd: str,
    env: Mapping[str, str] | None,
    stdin: bytes,
    timeout: float | None,
    max_output_bytes: int,
) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "argv": list(argv),
        "cwd": cwd,
        "env": dict(env or {}),
        "stdin": stdin,
        "timeout": duration(timeout),
        "max_output_bytes": max_output_bytes,
    }


class ProcessCalls:
    """Exec, Run, Interact, the background processes' calls and the calls by process handle
    for `Session`."""

    _client: SandboxClient

    @property
    def id(self) -> str:
        raise NotImplementedError

    @property
    def _stubs(self) -> Any:
        return self._client.stubs

    @rpc("ProcessService/Exec")
    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output_bytes: int = 0,
        keepalives: bool = False,
        deadline: float | None = None,
    ) -> AsyncIterator[Event]:
        """Run a command and yield its events as they happen: Started, Output..., Exited.

        `timeout` is the command's own (reported in Exited); `deadline` bounds the call.
        Leaving the loop early (break, an exception, cancellation) cancels the call, which
        kills the command's whole process tree on the server.
        """
        req = process_pb2.ExecRequest(
            **_exec_fields(self.id, argv, cwd, env, stdin, timeout, max_output_bytes)
        )
        stream = self._client._server_stream(
            lambda t: self._stubs.processes.Exec(req, timeout=t), deadline
        )
        async for event in events_of(stream, keepalives):
            yield event

    @rpc("ProcessService/Run")
    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output_bytes: int = 0,
        deadline: float | None = None,
        text: bool = False,
    ) -> RunResult:
        """Run a command and return its collected output (a non-zero exit is not raised).

        With `text` the result also has `stdout_text`/`stderr_text` (UTF-8, invalid bytes as
        U+FFFD), decoded by the server."""
        req = process_pb2.RunRequest(
            **_exec_fields(self.id, argv, cwd, env, stdin, timeout, max_output_bytes),
            output_encoding=(
                process_pb2.OUTPUT_ENCODING_UTF8_LOSSY
                if text
                else process_pb2.OUTPUT_ENCODING_BYTES
            ),
        )
        resp = await self._client._unary(
            "ProcessService/Run", lambda t: self._stubs.processes.Run(req, timeout=t), deadline
        )
        return RunResult.from_pb(resp)

    @rpc("ProcessService/Interact")
    def interact(
        self,
        argv: Sequence[str],
        *,
        pty: tuple[int, int] | None = None,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_output_bytes: int = 0,
        idle_timeout: float | None = None,
    ) -> Interaction:
        """A command with live stdin, signals and (with `pty=(rows, cols)`) a terminal.

        async with session.interact(["sh"], pty=(24, 80)) as proc:
            await proc.send(b"echo hi; exit 3\\n")
            async for event in proc: ...

        Unlike `run`, an interactive command has no deadline and no output cap unless
        `timeout` or `max_output_bytes` is given: it runs while it is used. `idle_timeout`
        (seconds; default the server's, 30 minutes) ends it after that long with no input and
        no output (`InteractIdle`).
        """
        start = process_pb2.InteractStart(
            request=process_pb2.ExecRequest(
                **_exec_fields(self.id, argv, cwd, env, b"", timeout, max_output_bytes)
            ),
            pty=process_pb2.PtySize(rows=pty[0], cols=pty[1]) if pty else None,
            idle_timeout=duration(idle_timeout),
        )
        return Interaction(self._client, start)

    @rpc("ProcessService/StartProcess")
    async def start_process(
        self,
        argv: Sequence[str],
        *,
        process_id: str = "",
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output_bytes: int = 0,
        deadline: float | None = UNSET,
        output_buffer_bytes: int = 0,
        keep_stdin_open: bool = False,
        request_id: str = "",
    ) -> ProcessInfo:
        """Start a background process: it outlives this call; `attach` replays its output.

        With `output_buffer_bytes` (the ring kept per stream) `max_output_bytes` is the cap
        that cuts output, as for `run`; without it, it is the ring size (deprecated meaning).
        `keep_stdin_open` lets `send_input` add stdin until `close_stdin`."""
        req = process_pb2.StartProcessRequest(
            **_exec_fields(self.id, argv, cwd, env, stdin, timeout, max_output_bytes),
            process_id=process_id,
            output_buffer_bytes=output_buffer_bytes,
            keep_stdin_open=keep_stdin_open,
            request_id=request_id,
        )
        resp = await self._client._unary(
            "ProcessService/StartProcess",
            lambda t: self._stubs.processes.StartProcess(req, timeout=t),
            deadline,
            idempotent=True if request_id else None,
        )
        return ProcessInfo.from_pb(resp.process)

    @rpc("ProcessService/AttachProcess")
    async def attach(
        self,
        process_id: str,
        *,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
        keepalives: bool = False,
        deadline: float | None = None,
    ) -> AsyncIterator[Event]:
        """A background process's output from the given offsets (replay), then live, then
        Exited. Output the server no longer holds arrives as an OutputGap."""
        req = process_pb2.AttachProcessRequest(
            session_id=self.id,
            process_id=process_id,
            stdout_offset=stdout_offset,
            stderr_offset=stderr_offset,
        )
        stream = self._client._server_stream(
            lambda t: self._stubs.processes.AttachProcess(req, timeout=t), deadline
        )
        async for event in events_of(stream, keepalives):
            yield event

    @rpc("ProcessService/ListProcesses")
    async def processes(
        self, *, page_size: int = 0, timeout: float | None = UNSET
    ) -> AsyncIterator[ProcessInfo]:
        """The background processes in start order, following pages as the loop goes."""
        async for resp in self._client._paged(
            "ProcessService/ListProcesses",
            lambda token, t: self._stubs.processes.ListProcesses(
                process_pb2.ListProcessesRequest(
                    session_id=self.id, page_size=page_size, page_token=token
                ),
                timeout=t,
            ),
            timeout,
        ):
            for p in resp.processes:
                yield ProcessInfo.from_pb(p)

    @rpc("ProcessService/SignalProcess")
    async def signal_process(
        self, process_id: str, signal: str = "SIGTERM", *, timeout: float | None = UNSET
    ) -> None:
        req = process_pb2.SignalProcessRequest(
            session_id=self.id, process_id=process_id, signal=signal
        )
        await self._client._unary(
            "ProcessService/SignalProcess",
            lambda t: self._stubs.processes.SignalProcess(req, timeout=t),
            timeout,
        )

    @rpc("ProcessService/GetProcess")
    async def get_process(self, process_id: str, *, timeout: float | None = UNSET) -> ProcessInfo:
        """Any process by the id Exec, Run, Interact or StartProcess reported."""
        req = process_pb2.GetProcessRequest(session_id=self.id, process_id=process_id)
        resp = await self._client._unary(
            "ProcessService/GetProcess",
            lambda t: self._stubs.processes.GetProcess(req, timeout=t),
            timeout,
        )
        return ProcessInfo.from_pb(resp.process)

    @rpc("ProcessService/SendProcessInput")
    async def send_input(
        self, process_id: str, data: bytes, *, timeout: float | None = UNSET
    ) -> None:
        """More stdin for a process started with `keep_stdin_open=True` (never retried: the
        bytes would be written twice)."""
        req = process_pb2.SendProcessInputRequest(
            session_id=self.id, process_id=process_id, data=data
        )
        await self._client._unary(
            "ProcessService/SendProcessInput",
            lambda t: self._stubs.processes.SendProcessInput(req, timeout=t),
            timeout,
        )

    @rpc("ProcessService/CloseProcessStdin")
    async def close_stdin(self, process_id: str, *, timeout: float | None = UNSET) -> None:
        """End of file on the process's stdin; closing twice is fine."""
        req = process_pb2.CloseProcessStdinRequest(session_id=self.id, process_id=process_id)
        await self._client._unary(
            "ProcessService/CloseProcessStdin",
            lambda t: self._stubs.processes.CloseProcessStdin(req, timeout=t),
            timeout,
        )
