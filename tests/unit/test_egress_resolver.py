"""The proxy's resolver against a black-hole DNS: lookups time out for real,
one session cannot take every lookup thread, and the server's shared thread pool
(`asyncio.to_thread`) stays fast whatever the resolver does."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sandboxd.egress.resolver import Resolver, ResolverBusy


@pytest.fixture
def black_hole(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """getaddrinfo that never answers (until the test ends): a resolver that drops queries."""
    release = threading.Event()

    def hang(*args: Any, **kwargs: Any) -> list[Any]:
        release.wait(30)
        raise socket.gaierror(socket.EAI_AGAIN, "black hole")

    monkeypatch.setattr(socket, "getaddrinfo", hang)
    yield release
    release.set()


async def test_lookups_time_out_and_shared_threads_stay_free(black_hole: threading.Event) -> None:
    resolver = Resolver(threads=4, timeout_s=0.3)
    try:
        started = time.monotonic()
        # many sessions, many names: far more lookups than the default pool has workers
        results = await asyncio.gather(
            *(resolver.resolve(f"n{i}.test", 443, owner=f"s{i % 8}") for i in range(64)),
            return_exceptions=True,
        )
        assert time.monotonic() - started < 2
        assert all(isinstance(r, TimeoutError | ResolverBusy) for r in results), results
        assert resolver.busy <= 4  # stuck lookups hold only the resolver's own threads
        # unrelated work on the default pool is not queued behind them
        t0 = time.monotonic()
        await asyncio.gather(*(asyncio.to_thread(sum, [1, 2]) for _ in range(64)))
        assert time.monotonic() - t0 < 1
    finally:
        black_hole.set()
        resolver.close()


async def test_one_session_cannot_take_every_thread(black_hole: threading.Event) -> None:
    resolver = Resolver(threads=4, timeout_s=0.2)
    try:
        for _ in range(2):
            with pytest.raises(TimeoutError):
                await resolver.resolve("stuck.test", 443, owner="hog")
        # the hog's two stuck threads still count against it (half the threads)...
        with pytest.raises(ResolverBusy):
            await resolver.resolve("more.test", 443, owner="hog")
        # ...while another session still gets a thread of its own
        with pytest.raises(TimeoutError):
            await resolver.resolve("other.test", 443, owner="bystander")
        black_hole.set()  # the black hole answers at last: the threads come back
        deadline = time.monotonic() + 5
        while resolver.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert resolver.busy == 0
    finally:
        black_hole.set()
        resolver.close()


async def test_static_names_and_real_lookups() -> None:
    resolver = Resolver({"up.test": ("192.0.2.7",)}, threads=2, timeout_s=5)
    try:
        assert await resolver.resolve("up.test", 80, owner="s") == ["192.0.2.7"]
        assert "127.0.0.1" in await resolver.resolve("localhost", 80, owner="s")
        assert resolver.busy == 0
    finally:
        resolver.close()
