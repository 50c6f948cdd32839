"""Unit tests of the loop-to-thread queues of an import (sandboxd.archive.pipe), driven by a
fake consumer thread in place of tarfile and a fake writer in place of the container."""

from __future__ import annotations

import asyncio
import io
import tarfile
import threading
from collections.abc import Iterator

import pytest
from sandboxd.archive import check_and_forward, pipe
from sandboxd.archive.policy import (
    MAX_EXTENDED_HEADER_BYTES,
    ArchiveLimits,
    MemberChecker,
    stream_allowance,
)
from sandboxd.errors import InvalidArgument, ResourceExhausted


async def _run_thread(fn: object) -> object:
    """Run `fn` on a thread of its own (as the import does): its result or its exception."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[object] = loop.create_future()

    def work() -> None:
        try:
            result: object = fn()  # type: ignore[operator]
        except BaseException as exc:
            result = exc
        loop.call_soon_threadsafe(pipe.settle, done, result)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        return await done
    except Exception as exc:
        return exc
    finally:
        await pipe.join_thread(thread)


async def test_inbox_hands_every_chunk_to_the_thread_in_order_and_bounds_its_bytes() -> None:
    inbox = pipe.Inbox(asyncio.get_running_loop(), limit=1000)
    chunks = [bytes([i]) * (100 + i) for i in range(60)]
    seen_sizes: list[int] = []

    def consume() -> bytes:
        out = bytearray()
        while (data := inbox.get()) is not None:
            seen_sizes.append(inbox._size)
            out += data
        return bytes(out)

    consumer = asyncio.ensure_future(_run_thread(consume))
    for chunk in chunks:
        await inbox.put(chunk)
        assert inbox._size <= 1000 + len(chunk)  # one chunk always fits, never more
    inbox.end()
    assert await consumer == b"".join(chunks)
    assert max(seen_sizes) < 1000 + max(map(len, chunks))  # below the limit, plus one chunk


async def test_a_waiting_thread_gets_a_small_chunk_while_the_client_still_sends() -> None:
    """The thread is woken for a batch of chunks, not each one; a client that pauses after a
    few bytes (its stream still open) has them read anyway, so a bad member is refused at once
    rather than when the client gives up."""
    inbox = pipe.Inbox(asyncio.get_running_loop(), limit=pipe.INBOX_BYTES)
    consumer = asyncio.ensure_future(_run_thread(inbox.get))
    while not inbox._thread_waits:
        await asyncio.sleep(0.001)
    await inbox.put(b"abc")  # far below INBOX_WAKE, and no end()
    assert await consumer == b"abc"
    inbox.end()


async def test_inbox_error_reaches_the_thread_where_the_data_stops() -> None:
    inbox = pipe.Inbox(asyncio.get_running_loop(), limit=1000)
    await inbox.put(b"abc")
    inbox.end(ValueError("client went away"))

    def consume() -> None:
        while inbox.get() is not None:
            pass

    result = await _run_thread(consume)
    assert isinstance(result, ValueError)


async def test_a_cancelled_inbox_stops_a_waiting_thread() -> None:
    inbox = pipe.Inbox(asyncio.get_running_loop(), limit=1000)
    consumer = asyncio.ensure_future(_run_thread(inbox.get))
    await asyncio.sleep(0.05)
    inbox.cancel()
    assert isinstance(await consumer, pipe.Cancelled)


async def test_outbox_blocks_the_thread_while_full_and_the_writer_takes_everything() -> None:
    outbox = pipe.Outbox(asyncio.get_running_loop(), limit=300)
    pieces = [bytes([i]) * 100 for i in range(20)]

    def produce() -> None:
        for p in pieces:
            outbox.put(p)

    producer = asyncio.ensure_future(_run_thread(produce))
    got: list[bytes] = []
    while len(got) < len(pieces):
        items = await outbox.take()
        assert items is not None
        assert sum(map(len, items)) <= 300 + 100
        got.extend(items)
    await producer
    outbox.close()
    assert await outbox.take() is None
    assert got == pieces


async def test_outbox_gone_fails_the_threads_next_write() -> None:
    outbox = pipe.Outbox(asyncio.get_running_loop(), limit=100)
    outbox.gone()
    result = await _run_thread(lambda: outbox.put(b"x"))
    assert isinstance(result, pipe.SinkError)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop the queues belong to; these tests run both ends on this thread."""
    made = asyncio.new_event_loop()
    yield made
    made.close()


def _source(loop: asyncio.AbstractEventLoop, data: bytes, chunk: int = 700) -> pipe.Source:
    """A Source over `data` already queued (the inbox is not bounded here)."""
    inbox = pipe.Inbox(loop, limit=len(data) + 1)
    for i in range(0, len(data), chunk):
        inbox._items.append(data[i : i + chunk])
    inbox.end()
    return pipe.Source(inbox)


def _tar(*members: tuple[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_source_refuses_an_oversized_extension_record_before_reading_it(
    loop: asyncio.AbstractEventLoop,
) -> None:
    src = _source(loop, b"\0" * 100_000)
    with pytest.raises(InvalidArgument) as exc:
        src.read(MAX_EXTENDED_HEADER_BYTES + 512)
    assert exc.value.reason == "ARCHIVE_INVALID"
    assert src.position == 0  # not a byte of it was taken


def test_source_refuses_a_pax_record_of_digits_before_tarfile_parses_it(
    loop: asyncio.AbstractEventLoop,
) -> None:
    header = tarfile.TarInfo("././@PaxHeader")
    header.type = tarfile.XHDTYPE
    payload = b"9" * 5000
    header.size = len(payload)
    data = header.tobuf(tarfile.USTAR_FORMAT) + payload + b"\0" * (-len(payload) % 512)
    src = _source(loop, data + _tar(("a", b"x")))
    with pytest.raises(InvalidArgument) as exc:
        tarfile.open(fileobj=src, mode="r:")  # type: ignore[call-overload]
    assert exc.value.reason == "ARCHIVE_INVALID"
    assert "digits" in str(exc.value)


def _forward(
    loop: asyncio.AbstractEventLoop, data: bytes, limits: ArchiveLimits
) -> tuple[tuple[int, int], bytes]:
    """check_and_forward with the outbox read afterwards in place of the container's tar."""
    outbox = pipe.Outbox(loop, limit=1 << 30)
    sink = pipe.Sink(outbox)
    counts = check_and_forward(_source(loop, data), sink, MemberChecker(limits))
    return counts, b"".join(bytes(x) for x in outbox._items)


def test_forwarded_archive_is_a_clean_tar_of_the_same_members(
    loop: asyncio.AbstractEventLoop,
) -> None:
    data = _tar(("a.txt", b"hello"), ("d/b.bin", bytes(range(256)) * 10))
    (members, content), out = _forward(loop, data, ArchiveLimits(10, 1 << 20, 1 << 20))
    assert (members, content) == (2, 5 + 2560)
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert got == {"a.txt": b"hello", "d/b.bin": bytes(range(256)) * 10}
    assert len(out) <= stream_allowance(content, members)


def test_sink_counts_headers_and_names_against_the_cap(loop: asyncio.AbstractEventLoop) -> None:
    # 300 empty files with 3 KiB names: no data at all, ~1 MiB of headers, a 64 KiB cap.
    names = [f"{i:03d}" + "n" * 250 + "/" + "m" * 250 for i in range(300)]
    data = _tar(*((n, b"") for n in names))
    with pytest.raises(ResourceExhausted) as exc:
        _forward(loop, data, ArchiveLimits(1000, 1 << 20, 64 * 1024))
    assert exc.value.reason == "WORKSPACE_FULL"


def test_real_pax_records_pass_the_extension_checks(loop: asyncio.AbstractEventLoop) -> None:
    # Long names (PAX path records), a name of 40 digits, an mtime with nanoseconds.
    long = "/".join(["p" * 200] * 15) + "/" + "7" * 40
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(long)
        info.size = 3
        info.pax_headers = {"mtime": "1700000000.123456789"}
        tar.addfile(info, io.BytesIO(b"abc"))
    (members, content), out = _forward(loop, buf.getvalue(), ArchiveLimits(10, 100, 100))
    assert (members, content) == (1, 3)
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        assert tar.getnames() == [long]
