"""`sandboxctl shell`: the user's terminal joined to a command on a PTY in the session.

The local terminal goes into raw mode (keys, Ctrl-C included, go to the remote side) and is
restored however the call ends; SIGWINCH sends the new size; the remote exit code becomes
sandboxctl's. Without a local terminal (stdin piped) it still works, with a fixed 24x80 size.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when a command runs: the parser needs none of them
    from sandboxd_client.events import Exited
    from sandboxd_client.session import Session


_READ = 64 * 1024


def _size(fd: int) -> tuple[int, int]:
    try:
        cols, rows = os.get_terminal_size(fd)
    except OSError:
        cols, rows = shutil.get_terminal_size((80, 24))
    return max(rows, 1), max(cols, 1)


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    """Raw mode on a terminal, restored on the way out; nothing on a pipe."""
    if not os.isatty(fd):
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def exit_status(event: Exited) -> int:
    """The remote exit code; a command killed by signal N exits 128+N, as in a local shell."""
    if event.exit_code >= 0:
        return event.exit_code
    number = signal.Signals.__members__.get(event.signal)
    return 128 + int(number) if number is not None else 1


async def run_shell(
    session: Session,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    idle_timeout: float | None = None,
) -> int:
    """A terminal on `argv` until it exits: no deadline unless `timeout`, and the server's idle
    timeout (30 minutes of no typing and no output) unless `idle_timeout`."""
    from sandboxd_client.events import Exited, Output

    loop = asyncio.get_running_loop()
    in_fd = sys.stdin.fileno()
    out = sys.stdout.buffer
    exit_code = 1
    term_env = {"TERM": os.environ.get("TERM", "xterm"), **(env or {})}
    interaction = session.interact(
        argv, pty=_size(in_fd), env=term_env, timeout=timeout, idle_timeout=idle_timeout
    )
    async with interaction as proc:
        stdin_data: asyncio.Queue[bytes] = asyncio.Queue(maxsize=16)
        reading = [True]

        def readable() -> None:
            try:
                data = os.read(in_fd, _READ)
            except OSError:
                data = b""
            stdin_data.put_nowait(data)
            if not data or stdin_data.full():
                # At EOF for good; when full, until the pump catches up (backpressure).
                loop.remove_reader(in_fd)
                reading[0] = bool(data)

        async def pump() -> None:
            while True:
                data = await stdin_data.get()
                if not data:
                    await proc.close_stdin()
                    return
                await proc.send(data)
                if reading[0] and stdin_data.qsize() < stdin_data.maxsize // 2:
                    loop.add_reader(in_fd, readable)

        def resized() -> None:
            rows, cols = _size(in_fd)
            resizes.append(loop.create_task(proc.resize(rows, cols)))

        resizes: list[asyncio.Task[None]] = []
        with raw_terminal(in_fd):
            loop.add_reader(in_fd, readable)
            loop.add_signal_handler(signal.SIGWINCH, resized)
            pumping = loop.create_task(pump())
            try:
                async for event in proc:
                    if isinstance(event, Output):
                        out.write(event.data)
                        out.flush()
                    elif isinstance(event, Exited):
                        exit_code = exit_status(event)
            finally:
                loop.remove_signal_handler(signal.SIGWINCH)
                loop.remove_reader(in_fd)
                pumping.cancel()
                for task in (pumping, *resizes):
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
    return exit_code
