"""A synchronous client: the asyncio client's methods and types, for scripts and notebooks.

    from sandboxd_client.sync import SandboxClient

    with SandboxClient("127.0.0.1:50051") as client:
        with client.create_session(allow=["sh"]) as session:      # deleted when the block ends
            print(session.run(["sh", "-c", "echo hi"]).stdout)
            for event in session.exec(["sh", "-c", "echo a; echo b"]):
                ...
            session.write_file("notes.txt", b"hello")

Every method of `sandboxd_client.SandboxClient` and `Session` is here under the same name, with
the same arguments, results and errors (the dataclasses of `sandboxd_client.models`, the
classes of `sandboxd_client.errors`): a coroutine becomes a call that returns its result, an
async iterator an iterator, an async context manager (a session, `session.interact(...)`) a
`with` block. The asyncio client runs on an event loop of this client's own, in a thread it
owns and stops at `close()`, so it works where another loop is already running (a Jupyter
notebook) and where none is (a script). Calls from several threads are safe; each waits for
its own answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Self, TypeVar

from sandboxd_client import client as _async
from sandboxd_client import session as _async_session
from sandboxd_client.models import Event, FileInfo, RunResult, ServerInfo

T = TypeVar("T")


class _Loop:
    """An event loop in a daemon thread: the asyncio client lives and runs there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="sandboxd-client", daemon=True
        )
        self._thread.start()

    def run(self, work: Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await work

        future = asyncio.run_coroutine_threadsafe(wrapped(), self.loop)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()  # ^C in a notebook or script ends the call, and so the command
            raise

    def iterate(self, source: AsyncIterator[Any]) -> Iterator[Any]:
        try:
            while True:
                try:
                    item = self.run(source.__anext__())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            closing = getattr(source, "aclose", None)
            if closing is not None:  # leaving the loop early ends the call, as async for does
                with contextlib.suppress(Exception):
                    self.run(closing())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class _Blocking:
    """An object of the asyncio client seen synchronously (see the module's docstring)."""

    def __init__(self, target: Any, loop: _Loop) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_loop", loop)

    def _convert(self, value: Any) -> Any:
        if isinstance(value, Coroutine) or inspect.isawaitable(value):
            return self._convert(self._loop.run(value))
        if hasattr(value, "__anext__"):
            return (self._convert(item) for item in self._loop.iterate(value))
        if isinstance(value, _async_session.Session):
            return Session(value, self._loop)
        if _is_client_object(value):
            return _Blocking(value, self._loop)
        return value

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return self._convert(value)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._convert(value(*args, **kwargs))

        call.__name__ = name
        call.__doc__ = getattr(value, "__doc__", None)
        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._target)))

    def __enter__(self) -> Self:
        entered = self._loop.run(self._target.__aenter__())
        if entered is not self._target:
            object.__setattr__(self, "_target", entered)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._loop.run(self._target.__aexit__(exc_type, exc, tb))

    def __iter__(self) -> Iterator[Any]:
        return (self._convert(i) for i in self._loop.iterate(self._target.__aiter__()))

    def __repr__(self) -> str:
        return f"sync {self._target!r}"


def _is_client_object(value: Any) -> bool:
    """A helper object of the asyncio client (an interaction, a session's file transfers), not
    a result: results are dataclasses and plain values, passed on as they are."""
    kind = type(value)
    return (
        kind.__module__.startswith("sandboxd_client.")
        and not dataclasses.is_dataclass(value)
        and not isinstance(value, BaseException)
        and any(inspect.iscoroutinefunction(getattr(kind, n, None)) for n in dir(kind))
    )


class Session(_Blocking):
    """`sandboxd_client.Session`, synchronously; `with` deletes it at the end of the block.

    The most used calls are typed here; every other method of the asyncio Session is reached
    by the same name and arguments."""

    @property
    def id(self) -> str:
        return str(self._target.id)

    def run(self, argv: list[str], **options: Any) -> RunResult:
        result: RunResult = self._convert(self._target.run(argv, **options))
        return result

    def exec(self, argv: list[str], **options: Any) -> Iterator[Event]:
        events: Iterator[Event] = self._convert(self._target.exec(argv, **options))
        return events

    def read_file(self, path: str, **options: Any) -> bytes:
        data: bytes = self._convert(self._target.read_file(path, **options))
        return data

    def write_file(self, path: str, content: bytes, **options: Any) -> FileInfo:
        info: FileInfo = self._convert(self._target.write_file(path, content, **options))
        return info

    def delete(self, **options: Any) -> bool:
        existed: bool = self._convert(self._target.delete(**options))
        return existed


class SandboxClient(_Blocking):
    """`sandboxd_client.SandboxClient`, synchronously: the same arguments; `with` or `close()`."""

    def __init__(self, address: str | None = None, **options: Any) -> None:
        loop = _Loop()

        async def opened() -> _async.SandboxClient:
            inner = _async.SandboxClient(address, **options)
            inner.open()  # inside the loop: its channel belongs to that loop
            return inner

        try:
            inner = loop.run(opened())
        except BaseException:
            loop.stop()
            raise
        super().__init__(inner, loop)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        loop: _Loop = self._loop
        if loop.loop.is_closed():
            return
        try:
            loop.run(self._target.close())
        finally:
            loop.stop()

    def create_session(self, **options: Any) -> Session:
        session: Session = self._convert(self._target.create_session(**options))
        return session

    def session(self, session_id: str) -> Session:
        return Session(self._target.session(session_id), self._loop)

    def get_session(self, session_id: str, **options: Any) -> Session:
        session: Session = self._convert(self._target.get_session(session_id, **options))
        return session

    def list_sessions(self, *args: Any, **options: Any) -> Iterator[Session]:
        sessions: Iterator[Session] = self._convert(self._target.list_sessions(*args, **options))
        return sessions

    def server_info(self, **options: Any) -> ServerInfo:
        info: ServerInfo = self._convert(self._target.server_info(**options))
        return info


__all__ = ["SandboxClient", "Session"]
