"""A command run by the agent, as the engine protocol's `ExecStream` (plus resize and its
status, which the engine's exec offers by exec id)."""

from __future__ import annotations

import signal as signals
from collections.abc import Mapping, Sequence
from typing import Any

from sandboxd.agent import frames
from sandboxd.agent.channel import Channel
from sandboxd.agent.port import ExecStatus
from sandboxd.agent.streams import AgentStream
from sandboxd.profile import searched

READ_JOIN = 64 * 1024  # execution.CHUNK_BYTES: the largest output event


def exec_request(
    argv: Sequence[str],
    *,
    base_env: Mapping[str, str],
    env: Mapping[str, str] | None,
    workdir: str | None,
    stdin: bool,
    tty: bool,
) -> dict[str, Any]:
    """The OPEN `exec` request of docs/agent.md, with what `docker exec` gives a command: the
    container's environment (`base_env`) overridden by `env`, the working directory `/` unless
    told, and a tty of 24x80 until its first resize. (The agent runs a command with exactly
    the `env` it is given.) The agent executes absolute paths only: a bare name (`df`) goes
    through `sbx run`, which searches PATH as `docker exec` did."""
    return {
        "argv": searched(argv),
        "env": {**base_env, **(env or {})},
        "cwd": workdir or "/",
        "stdin": stdin,
        "tty": {"rows": 24, "cols": 80} if tty else None,
        "detach": None,
    }


def exit_status(exit_doc: Mapping[str, Any]) -> int:
    """EXIT's `exit_code` is already what a shell (and `docker exec`) reports: 128 + N when
    signal N ended the process."""
    return int(exit_doc["exit_code"])


class AgentExec:
    """One `exec` stream; `close` resets it (the agent ends the command at once)."""

    def __init__(self, channel: Channel, stream: AgentStream, exec_id: str, pid: int) -> None:
        self._channel = channel
        self._stream = stream
        self.exec_id = exec_id
        self.pid = pid
        self.opened: dict[str, Any] = stream.opened.result()  # OPEN_OK's document

    async def read(self) -> tuple[int, bytes] | None:
        """The next output, joined with what of the same fd has already arrived (up to a
        gRPC message's worth): one queue item and one event instead of one per frame."""
        return await self.read_joined(READ_JOIN)

    async def read_joined(self, limit: int) -> tuple[int, bytes] | None:
        first = await self._stream.read()
        if first is None or len(first[1]) >= limit:
            return first
        fd, data = first
        more = self._stream.read_ready(fd, limit - len(data))
        return (fd, data) if not more else (fd, b"".join([data, *more]))

    async def write(self, data: bytes) -> None:
        """Stdin; a command that has ended is a ConnectionError (a broken pipe), as with
        `docker exec`: the caller reads the real outcome from the output side."""
        if self._stream.ended:
            raise ConnectionError("the command has ended")
        try:
            await self._stream.write(0, data)
        except Exception as exc:
            raise ConnectionError(f"stdin of the command: {exc}") from exc

    def close_stdin(self) -> None:
        self._stream.send_eof(0)

    @property
    def reset_name(self) -> str:
        return self._stream.reset_name

    async def close(self) -> None:
        self._channel.release(self._stream)

    def resize(self, rows: int, cols: int) -> None:
        self._stream.send_control(frames.resize(self._stream.id, rows, cols))

    def signal(self, signo: signals.Signals) -> None:
        self._stream.send_control(frames.signal(self._stream.id, int(signo)))

    def inspect(self) -> ExecStatus:
        """Where the command is: a stream we reset counts as ended, since the agent ends its
        command at once (SIGHUP, SIGKILL a second later)."""
        s = self._stream
        code: int | None = None
        if s.exit is not None:
            code = exit_status(s.exit)
        elif s.ended:
            code = -1
        return ExecStatus(running=not s.ended, exit_code=code, pid=self.pid)

    async def exit_code(self) -> int | None:
        return self.inspect().exit_code if self._stream.ended else None

    async def wait_exit_code(self) -> int:
        """The exit status once the stream has ended; the stream's error if it broke (the
        epoch ended: AGENT_RESTARTED; the agent broke the protocol: AGENT_PROTOCOL_ERROR)."""
        await self._stream.done.wait()
        if self._stream.exit is not None:
            return exit_status(self._stream.exit)
        if self._stream.error is not None and not self._stream.reset_by_us:
            raise self._stream.error
        return -1
