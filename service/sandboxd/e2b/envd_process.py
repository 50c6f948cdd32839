"""envd's `process.Process` as ProcessService calls.

An E2B process is a sandboxd background process whose process id is the E2B pid written in
decimal (StartProcess takes a caller-chosen id), so the mapping needs no table and survives a
restart of the server. A PTY process is an Interact call the door holds (`pty.py`), since
background processes have no terminal. Output and the exit arrive through AttachProcess.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf import duration_pb2

from sandboxd.e2b.backend import Backend, metadata
from sandboxd.e2b.connect import ConnectError
from sandboxd.e2b.process_events import end_event, output_event
from sandboxd.e2b.pty import Ptys
from sandboxd.e2b.wire import data, field, obj, string_map, text, to_home, to_workspace, uint
from sandboxd.v1 import process_pb2

MIN_PID, MAX_PID = 1000, 2**31 - 1
SIGNALS = {"SIGNAL_SIGKILL": "SIGKILL", "SIGNAL_SIGTERM": "SIGTERM", 9: "SIGKILL", 15: "SIGTERM"}


def new_pid() -> int:
    return MIN_PID + secrets.randbelow(MAX_PID - MIN_PID)


def pid_of(selector: dict[str, Any]) -> int:
    if field(selector, "tag") is not None and field(selector, "pid") is None:
        raise ConnectError("unimplemented", "selecting a process by tag is not supported")
    pid = uint(selector, "pid")
    if not 0 < pid <= MAX_PID:
        raise ConnectError("invalid_argument", "process.pid is required")
    return pid


class ProcessRpcs:
    def __init__(self, backend: Backend, ptys: Ptys, timeout_s: float) -> None:
        self._b = backend
        self._ptys = ptys
        self._timeout_s = timeout_s  # each process's own limit: the server's maximum

    async def start(self, key: str, sid: str, req: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        config = obj(req, "process")
        cmd = text(config, "cmd")
        args = field(config, "args", []) or []
        if not cmd or not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConnectError("invalid_argument", "process.cmd and process.args are required")
        cwd = to_workspace(text(config, "cwd") or "/home/user")
        env = string_map(config, "envs")
        pid = new_pid()
        pty = obj(req, "pty")
        if pty:
            size = obj(pty, "size")
            async for event in self._ptys.start(
                key, sid, pid, [cmd, *args], cwd, env, uint(size, "rows"), uint(size, "cols")
            ):
                yield event
            return
        await self._b.processes.StartProcess(
            process_pb2.StartProcessRequest(
                session_id=sid,
                argv=[cmd, *args],
                cwd=cwd,
                env=env,
                process_id=str(pid),
                keep_stdin_open=bool(field(req, "stdin", False)),
                timeout=duration_pb2.Duration(seconds=int(self._timeout_s)),
            ),
            metadata=metadata(key),
        )
        async for event in self._follow(key, sid, pid, 0, 0):
            yield event

    async def connect(
        self, key: str, sid: str, req: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        pid = pid_of(obj(req, "process"))
        if self._ptys.has(sid, pid):
            async for event in self._ptys.connect(sid, pid):
                yield event
            return
        got = await self._b.processes.GetProcess(
            process_pb2.GetProcessRequest(session_id=sid, process_id=str(pid)),
            metadata=metadata(key),
        )
        # From now on, as envd's Connect: what the process already wrote is not sent again.
        p = got.process
        async for event in self._follow(key, sid, pid, p.stdout_bytes, p.stderr_bytes):
            yield event

    async def _follow(
        self, key: str, sid: str, pid: int, out_at: int, err_at: int
    ) -> AsyncIterator[dict[str, Any]]:
        call = self._b.processes.AttachProcess(
            process_pb2.AttachProcessRequest(
                session_id=sid, process_id=str(pid), stdout_offset=out_at, stderr_offset=err_at
            ),
            metadata=metadata(key),
        )
        yield {"event": {"start": {"pid": pid}}}
        try:
            async for r in call:
                kind = r.WhichOneof("event")
                if kind == "output":
                    yield output_event(r.output.stream, r.output.data)
                elif kind == "exited":
                    yield end_event(r.exited)
                    return
                elif kind == "keepalive":
                    yield {"event": {"keepalive": {}}}
        finally:
            call.cancel()

    async def list(self, key: str, sid: str, req: dict[str, Any]) -> dict[str, Any]:
        got = await self._b.processes.ListProcesses(
            process_pb2.ListProcessesRequest(session_id=sid), metadata=metadata(key)
        )
        out = [
            {
                "pid": int(p.process_id),
                "config": {"cmd": p.argv[0], "args": list(p.argv[1:]), "cwd": to_home(p.cwd)},
            }
            for p in got.processes
            if p.process_id.isdigit() and p.state == process_pb2.PROCESS_STATE_RUNNING and p.argv
        ]
        return {"processes": out + self._ptys.listed(sid)}

    async def send_input(self, key: str, sid: str, req: dict[str, Any]) -> dict[str, Any]:
        await self._input(key, sid, pid_of(obj(req, "process")), obj(req, "input"))
        return {}

    async def _input(self, key: str, sid: str, pid: int, given: dict[str, Any]) -> None:
        if field(given, "pty") is not None:
            await self._ptys.send(sid, pid, data(given, "pty"))
            return
        await self._b.processes.SendProcessInput(
            process_pb2.SendProcessInputRequest(
                session_id=sid, process_id=str(pid), data=data(given, "stdin")
            ),
            metadata=metadata(key),
        )

    async def stream_input(
        self, key: str, sid: str, messages: AsyncIterator[dict[str, Any]]
    ) -> dict[str, Any]:
        pid = 0
        async for m in messages:
            if field(m, "start") is not None:
                pid = pid_of(obj(obj(m, "start"), "process"))
            elif field(m, "data") is not None:
                if not pid:
                    raise ConnectError("invalid_argument", "the first message must be `start`")
                await self._input(key, sid, pid, obj(obj(m, "data"), "input"))
        return {}

    async def send_signal(self, key: str, sid: str, req: dict[str, Any]) -> dict[str, Any]:
        pid = pid_of(obj(req, "process"))
        name = SIGNALS.get(field(req, "signal"))
        if name is None:
            raise ConnectError("invalid_argument", "signal is SIGNAL_SIGKILL or SIGNAL_SIGTERM")
        if self._ptys.has(sid, pid):
            await self._ptys.signal(sid, pid, name)
            return {}
        await self._b.processes.SignalProcess(
            process_pb2.SignalProcessRequest(session_id=sid, process_id=str(pid), signal=name),
            metadata=metadata(key),
        )
        return {}

    async def close_stdin(self, key: str, sid: str, req: dict[str, Any]) -> dict[str, Any]:
        pid = pid_of(obj(req, "process"))
        if self._ptys.has(sid, pid):
            raise ConnectError("failed_precondition", "a PTY's stdin is closed with Ctrl-D")
        await self._b.processes.CloseProcessStdin(
            process_pb2.CloseProcessStdinRequest(session_id=sid, process_id=str(pid)),
            metadata=metadata(key),
        )
        return {}

    async def update(self, key: str, sid: str, req: dict[str, Any]) -> dict[str, Any]:
        pid = pid_of(obj(req, "process"))
        size = obj(obj(req, "pty"), "size")
        if not size:
            return {}
        await self._ptys.resize(sid, pid, uint(size, "rows"), uint(size, "cols"))
        return {}
