"""`docker exec` (the protocol's `EngineExec`): starting one, its stream as the protocol's
`ExecStream` (multiplexed stdio, half-close of stdin, the exit code once the engine records
it), its resize and its status."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

import aiodocker
from aiodocker.containers import DockerContainer
from aiodocker.execs import Exec
from aiodocker.stream import Stream

from sandboxd.engine import compat
from sandboxd.engine.protocol import ExecRequest, ExecStatus

READ_JOIN = 64 * 1024  # execution.CHUNK_BYTES: the largest output event


class ExecHost(Protocol):
    """What an exec's stream needs of the adapter that started it (DockerEngine is one):
    its error translation and the exec's status, not the adapter itself."""

    def _translate(self, what: str) -> contextlib.AbstractContextManager[None]: ...

    async def exec_status(self, exec_id: str) -> ExecStatus: ...


class DockerExecStream:
    """A running `docker exec` with its multiplexed stdio (the protocol's ExecStream)."""

    def __init__(self, engine: ExecHost, exec_id: str, stream: Stream) -> None:
        self._engine = engine
        self.exec_id = exec_id
        self._stream = stream
        self._stdin_closed = False

    async def read(self) -> tuple[int, bytes] | None:
        """Next (fd, data) chunk, 1 = stdout and 2 = stderr, joined with what of the same fd
        has already arrived (up to a gRPC message's worth); None at the end of output."""
        return await self.read_joined(READ_JOIN)

    async def _read_one(self) -> tuple[int, bytes] | None:
        with self._engine._translate("reading exec output"):
            msg = await self._stream.read_out()
        if msg is None:
            return None
        return msg.stream, msg.data

    async def read_joined(self, limit: int) -> tuple[int, bytes] | None:
        """Like read(), joined with the frames of the same fd that have already arrived, up to
        about `limit` bytes: one step per batch instead of per frame (busybox writes 4 KiB at a
        time). Waits only for the first frame; order across fds is kept."""
        first = await self._read_one()
        if first is None or len(first[1]) >= limit:
            return first
        fd, data = first
        parts = [data]
        with self._engine._translate("reading exec output"):
            await compat.read_buffered(self._stream, fd, parts, limit)
        return (fd, data) if len(parts) == 1 else (fd, b"".join(parts))

    async def write(self, data: bytes) -> None:
        with self._engine._translate("writing exec stdin"):
            await self._stream.write_in(data)

    def close_stdin(self) -> None:
        """Half-close: the command sees EOF on stdin while its output keeps flowing.

        aiodocker's own `close()` also drops the connection, so reach for the transport.
        """
        if self._stdin_closed:
            return
        self._stdin_closed = True
        compat.write_eof(self._stream)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._stream.close()

    async def exit_code(self) -> int | None:
        """The exit code once the process has ended (None while it still runs)."""
        status = await self._engine.exec_status(self.exec_id)
        return None if status.running else status.exit_code

    async def wait_exit_code(self) -> int:
        """The exit code after the output ended; -1 if the engine never records one.

        The output ends a moment before the engine records the exit, so poll briefly.
        """
        for delay in (0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0):
            if delay:
                await asyncio.sleep(delay)
            code = await self.exit_code()
            if code is not None:
                return code
        return -1


async def start_exec(
    engine: ExecHost, container: DockerContainer, request: ExecRequest
) -> DockerExecStream:
    """Create and start the exec of `request` in `container`, its stream hijacked."""
    execution = await container.exec(
        list(request.argv),
        stdin=request.stdin,
        tty=request.tty,
        user=request.user,
        environment=dict(request.env or {}),
        workdir=request.workdir,
    )
    stream = execution.start(timeout=None)
    await compat.start_stream(stream)
    return DockerExecStream(engine, execution.id, stream)


async def resize(docker: aiodocker.Docker, exec_id: str, rows: int, cols: int) -> None:
    await Exec(docker, exec_id).resize(h=rows, w=cols)


async def exec_status(docker: aiodocker.Docker, exec_id: str) -> ExecStatus:
    """`docker exec inspect` in the protocol's terms."""
    info = await Exec(docker, exec_id).inspect()
    code = info.get("ExitCode")
    pid = info.get("Pid")
    return ExecStatus(
        running=bool(info.get("Running")),
        exit_code=int(code) if code is not None else None,
        pid=pid if isinstance(pid, int) else 0,
    )
