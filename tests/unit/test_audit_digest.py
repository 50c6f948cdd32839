"""The audit record's SHA-256 of a caller's archive transfer (archive/calls.py), hashed off the
event loop in batches by the server's own threads: the same digest as hashing every byte in
order, whatever the chunk sizes and however far the hashing threads lag; a lagging pipeline
slows the transfer without blocking the loop; and the threads stop with the server, after the
last call's record."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace

import grpc
import pytest
from sandboxd import digest as audit_describe
from sandboxd import domain_events as de
from sandboxd.api.audit_interceptor import AuditInterceptor
from sandboxd.archive.calls import ArchiveCalls
from sandboxd.archive.transfer import ImportResult
from sandboxd.audit import AuditEvent, AuditWriter
from sandboxd.audit.subscriber import AuditSubscriber
from sandboxd.digest import Digest, hashing_threads
from sandboxd.v1 import snapshot_pb2, snapshot_pb2_grpc


class _Archive:
    """ArchiveIO's two doors, over given chunks: what the caller's transfer wraps."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def export(self, session: object, path: str) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk

    async def import_(
        self, session: object, path: str, replace: bool, chunks: AsyncIterator[bytes]
    ) -> ImportResult:
        async for _ in chunks:
            pass
        return ImportResult(files=1, bytes=5)


class _Recorder:
    def __init__(self) -> None:
        self.events: list[de.DomainEvent] = []

    def emit(self, event: de.DomainEvent) -> None:
        self.events.append(event)


_SESSION: object = SimpleNamespace(session_id="s", tenant="default")


async def _exported(calls: ArchiveCalls) -> de.DomainEvent:
    async for _ in calls.export(_SESSION, "."):  # type: ignore[arg-type]
        pass
    return calls._observer.events[-1]  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def hashers() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="test-sha256")
    yield pool
    pool.shutdown(wait=True)


def _chunks() -> list[bytes]:
    sizes = [1, 7, 4096, 65536, 65535, 300_000, 1, 1024 * 1024, 3 * 1024 * 1024 + 5]
    return [os.urandom(n) for n in sizes * 3]


@pytest.mark.parametrize("batch", [1, 1000, 64 * 1024, audit_describe.HASH_BATCH])
async def test_digest_matches_hashing_in_order(
    monkeypatch: pytest.MonkeyPatch, hashers: concurrent.futures.Executor, batch: int
) -> None:
    monkeypatch.setattr(audit_describe, "HASH_BATCH", batch)
    chunks = _chunks()
    digest = Digest(hashers)
    for chunk in chunks:
        await digest.update(chunk)
    assert await digest.hexdigest() == hashlib.sha256(b"".join(chunks)).hexdigest()


async def test_a_long_transfer_has_hashlibs_digest(hashers: concurrent.futures.Executor) -> None:
    """48 MiB in gRPC-sized chunks of an odd size: many batches through the pipeline."""
    block = os.urandom(65_519)
    count = 48 * 1024 * 1024 // len(block)
    calls = ArchiveCalls(_Archive([block] * count), hashers, _Recorder())  # type: ignore[arg-type]
    exp = await _exported(calls)
    assert isinstance(exp, de.ArchiveExported)
    assert exp.sha256 == hashlib.sha256(block * count).hexdigest()
    assert exp.tar_bytes == len(block) * count


class _LoopLag:
    """The longest the loop went without running a 1 ms ticker: a blocking call shows here."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.001)
            now = time.monotonic()
            self.worst = max(self.worst, now - last)
            last = now

    async def __aenter__(self) -> _LoopLag:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def test_a_full_pipeline_makes_the_transfer_wait_not_the_loop(
    monkeypatch: pytest.MonkeyPatch, hashers: concurrent.futures.Executor
) -> None:
    """Threads that do not get to run for a quarter of a second: the feeding call waits (no
    more than the backlog in flight, no more than one batch held), while the loop goes on
    serving others; the digest is still every byte in order."""
    gate = threading.Event()
    real = audit_describe._hash_after

    def slow(*args: object) -> None:
        gate.wait()
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(audit_describe, "HASH_BATCH", 10)
    monkeypatch.setattr(audit_describe, "_hash_after", slow)
    digest = Digest(hashers)
    chunks = [os.urandom(10) for _ in range(3 * audit_describe.HASH_BACKLOG)]
    fed = 0
    most = 0

    async def feed() -> None:
        nonlocal fed, most
        for chunk in chunks:
            await digest.update(chunk)
            fed += 1
            most = max(most, len(digest._inflight))
            assert digest._size < audit_describe.HASH_BATCH  # nothing piles up beyond a batch

    try:
        async with _LoopLag() as lag:
            feeder = asyncio.create_task(feed())
            await asyncio.sleep(0.25)
            stalled_at = fed  # the threads are still held: the feeder waits for room
            # Released by the test, not a timer: a loaded machine that slept past a timer saw
            # the threads run before the count was read.
            gate.set()
            await feeder
    finally:
        gate.set()
    assert stalled_at == audit_describe.HASH_BACKLOG
    assert most <= audit_describe.HASH_BACKLOG
    assert lag.worst < 0.2, f"the loop was blocked for {lag.worst:.3f} s"
    assert await digest.hexdigest() == hashlib.sha256(b"".join(chunks)).hexdigest()


async def test_import_and_export_events_carry_the_digest_once_done(
    hashers: concurrent.futures.Executor,
) -> None:
    data = [os.urandom(200_000) for _ in range(12)]
    expected = hashlib.sha256(b"".join(data)).hexdigest()

    observer = _Recorder()
    calls = ArchiveCalls(_Archive(data), hashers, observer)  # type: ignore[arg-type]

    async def sent() -> AsyncIterator[bytes]:
        for chunk in data:
            yield chunk

    result = await calls.import_(_SESSION, ".", False, sent())  # type: ignore[arg-type]
    assert (result.files, result.bytes) == (1, 5)
    [imp] = [e for e in observer.events if isinstance(e, de.ArchiveImported)]
    assert imp.sha256 == expected
    assert imp.tar_bytes == sum(map(len, data))

    exp = await _exported(calls)
    assert isinstance(exp, de.ArchiveExported)
    assert exp.sha256 == expected
    assert exp.tar_bytes == sum(map(len, data))


# The server's stop, in the order sandboxd.server composes it ---------------------------------

_CHUNK = os.urandom(256 * 1024)
_CHUNKS = 40  # 10 MiB: several batches, still streaming when the stop is asked


class _Paced:
    """ArchiveIO's export, paced: still streaming when the server is asked to stop."""

    def __init__(self) -> None:
        self.streaming = asyncio.Event()

    async def export(self, session: object, path: str) -> AsyncIterator[bytes]:
        for i in range(_CHUNKS):
            if i == 4:
                self.streaming.set()
            yield _CHUNK
            await asyncio.sleep(0.005)


class _Exporter(snapshot_pb2_grpc.SnapshotServiceServicer):  # type: ignore[misc]
    """The archive servicer's export over the caller's transfer (archive/calls.py): the
    hashing threads and the audit layer around it are what is tested."""

    def __init__(self, calls: ArchiveCalls, paced: _Paced) -> None:
        self._calls = calls
        self.streaming = paced.streaming

    async def ExportArchive(  # noqa: N802
        self, request: snapshot_pb2.ExportArchiveRequest, context: object
    ) -> AsyncIterator[snapshot_pb2.ExportArchiveResponse]:
        session = SimpleNamespace(session_id=request.session_id, tenant="default")
        async for data in self._calls.export(session, request.path):  # type: ignore[arg-type]
            yield snapshot_pb2.ExportArchiveResponse(chunk={"data": data})


async def test_the_hashing_threads_stop_with_the_server_after_the_last_record() -> None:
    """Stopped as sandboxd.server.parts/server_run do it: threads entered before the audit
    writer's close, the gRPC server stopped (draining an export in flight) before the stack
    closes. The export's record carries its digest, written while the threads still ran, and
    the threads are shut down once the stack is closed."""
    seen: list[tuple[AuditEvent, bool]] = []
    async with contextlib.AsyncExitStack() as stack:
        pool = await stack.enter_async_context(hashing_threads())

        def alive() -> bool:
            try:
                pool.submit(int)
            except RuntimeError:  # "cannot schedule new futures after shutdown"
                return False
            return True

        class Seeing(AuditWriter):
            """The audit log off; each record seen, with whether the threads still ran."""

            async def record(self, event: AuditEvent) -> AuditEvent:
                seen.append((event, alive()))
                return await super().record(event)

            def record_nowait(self, event: AuditEvent) -> None:
                seen.append((event, alive()))
                super().record_nowait(event)

        writer = Seeing(None)
        stack.push_async_callback(writer.close)
        observer = de.FanOut([AuditSubscriber(writer)])
        paced = _Paced()
        exporter = _Exporter(ArchiveCalls(paced, pool, observer), paced)  # type: ignore[arg-type]
        server = grpc.aio.server(interceptors=[AuditInterceptor(observer)])
        snapshot_pb2_grpc.add_SnapshotServiceServicer_to_server(exporter, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        got = bytearray()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = snapshot_pb2_grpc.SnapshotServiceStub(channel).ExportArchive(
                snapshot_pb2.ExportArchiveRequest(session_id="s-1", path=".")
            )

            async def read() -> None:
                async for reply in call:
                    got.extend(reply.chunk.data)

            reader = asyncio.create_task(read())
            await exporter.streaming.wait()
            await server.stop(10)  # the drain: the call in flight runs to its end
            await reader
        assert alive()  # the server stopped; its stack is not closed yet
    assert len(got) == len(_CHUNK) * _CHUNKS
    [(event, threads_ran)] = [(e, a) for e, a in seen if e.kind == "archive_export"]
    assert event.attributes["sha256"] == hashlib.sha256(got).hexdigest()
    assert threads_ran
    assert not alive()
