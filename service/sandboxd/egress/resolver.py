"""The proxies' name resolver: its own few threads, real timeouts, a cap per session.

`getaddrinfo` blocks a thread and cannot be cancelled. Run on the loop's default executor (as
`loop.getaddrinfo` does), a black-hole resolver let one tenant pin every worker of the pool
that the whole server's `asyncio.to_thread` calls share (measured: unrelated calls took 59 s).
Here lookups run on a small executor of their own; a timed-out lookup frees its caller at
once, and its thread is counted as busy (against the session that started it) until
`getaddrinfo` really returns. A session holding its share of the threads, or a resolver with
no thread left, is refused at once (`ResolverBusy`) instead of queueing behind stuck lookups.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import socket
from collections.abc import Callable, Mapping

MAX_ANSWERS = 32


class ResolverBusy(OSError):
    """No lookup thread for this caller now (its share is taken, or all threads are stuck)."""


class Resolver:
    """Names to addresses: the operator's static map first, else getaddrinfo on own threads."""

    def __init__(
        self,
        static: Mapping[str, tuple[str, ...]] | None = None,
        *,
        threads: int = 4,
        timeout_s: float = 5.0,
        per_session: int | None = None,
    ) -> None:
        self._static = dict(static or {})
        self._threads = threads
        self._timeout = timeout_s
        # One session may hold at most half the threads (at least one): another always has one.
        self._per_session = per_session or max(1, threads // 2)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # threads held per session, stuck ones included
        self._busy: collections.Counter[str] = collections.Counter()

    @property
    def busy(self) -> int:
        return self._busy.total()

    def close(self) -> None:
        """Stop taking lookups; stuck threads end when their getaddrinfo returns."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def resolve(self, name: str, port: int, *, owner: str = "") -> list[str]:
        if name in self._static:
            return list(self._static[name])
        if self._busy[owner] >= self._per_session:
            raise ResolverBusy(f"{self._per_session} lookups of this session are in flight")
        if self.busy >= self._threads:
            raise ResolverBusy("every resolver thread is busy")
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._threads, thread_name_prefix="sandboxd-dns"
            )
        self._busy[owner] += 1
        future = self._pool.submit(
            socket.getaddrinfo, name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
        loop = asyncio.get_running_loop()
        future.add_done_callback(lambda _: _call_soon(loop, self._done, owner))
        async with asyncio.timeout(self._timeout):
            infos = await asyncio.wrap_future(future)
        answers: list[str] = []
        for family, _, _, _, sockaddr in infos[:MAX_ANSWERS]:
            host = str(sockaddr[0])
            if family == socket.AF_INET6 and len(sockaddr) >= 4 and sockaddr[3]:
                host = f"{host}%{sockaddr[3]}"  # keep the zone id so the check refuses it
            if host not in answers:
                answers.append(host)
        return answers

    def _done(self, owner: str) -> None:
        """A lookup thread is free again (its lookup answered, failed, or was never run)."""
        self._busy -= collections.Counter({owner: 1})  # drops the session at zero


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[str], None], arg: str) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed while a lookup was stuck
        loop.call_soon_threadsafe(fn, arg)
