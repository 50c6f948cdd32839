"""The engine's multiplexed stdio split by docker_demux.Demux: the same messages, in the same
order, as aiodocker's own parser gives, however the socket's reads cut them; and the takeover
of a started stream's parser (compat.demux_in_one_copy), a message begun in it included."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

from aiodocker.stream import _ExecParser
from demux_wire import Queue, wire
from sandboxd.engine import compat
from sandboxd.engine.docker_demux import Demux


def feed(parser: Any, data: bytes, cuts: list[int]) -> None:
    at = 0
    for n in cuts:
        parser.feed_data(data[at : at + n])
        at += n
    if at < len(data):
        parser.feed_data(data[at:])


def test_every_cut_gives_the_messages_aiodocker_gives() -> None:
    rng = random.Random(5)
    sizes = [0, 1, 7, 8, 9, 511, 4096, 32768, 70000]
    for _ in range(300):
        messages = [
            (rng.choice([1, 2]), rng.randbytes(rng.choice(sizes))) for _ in range(rng.randint(1, 9))
        ]
        data = wire(messages)
        cuts = [rng.choice([1, 3, 7, 8, 9, 100, 4096, 65536, 262144]) for _ in range(400)]
        ours, theirs = Queue(), Queue()
        feed(Demux(ours), data, cuts)
        feed(_ExecParser(theirs), data, cuts)
        assert ours.messages == theirs.messages
        assert [(fd, body) for fd, body, _ in ours.messages] == messages
        assert all(type(body) is bytes for _, body, _ in ours.messages)


def test_a_read_that_ends_inside_a_header_or_a_body_waits_for_the_rest() -> None:
    q = Queue()
    demux = Demux(q)
    data = wire([(1, b"abcdef"), (2, b"xy")])
    for i in range(len(data)):  # one byte per read
        demux.feed_data(data[i : i + 1])
        if i < 13:
            assert q.messages == []
    assert q.messages == [(1, b"abcdef", 6), (2, b"xy", 2)]


def test_eof_and_errors_reach_the_queue() -> None:
    q = Queue()
    demux = Demux(q)
    demux.feed_eof()
    err = ConnectionResetError("gone")
    demux.set_exception(err)
    assert q.eof and q.error is err


def _started(parser: Any) -> Any:
    protocol = SimpleNamespace(_payload_parser=parser, transport=None)
    return SimpleNamespace(_resp=SimpleNamespace(connection=SimpleNamespace(protocol=protocol)))


def test_the_takeover_keeps_a_message_aiodocker_had_begun() -> None:
    q = Queue()
    old = _ExecParser(q)
    data = wire([(1, b"first"), (1, b"second message")])
    old.feed_data(data[:20])  # the first message and part of the second
    stream = _started(old)
    assert compat.demux_in_one_copy(stream)
    demux = stream._resp.connection.protocol._payload_parser
    assert isinstance(demux, Demux)
    demux.feed_data(data[20:])
    assert q.messages == [(1, b"first", 5), (1, b"second message", 14)]


def test_no_takeover_of_a_tty_stream_or_an_unknown_layout() -> None:
    tty = _ExecParser(Queue(), tty=True)
    stream = _started(tty)
    assert not compat.demux_in_one_copy(stream)
    assert stream._resp.connection.protocol._payload_parser is tty
    assert not compat.demux_in_one_copy(_started(object()))
    assert not compat.demux_in_one_copy(SimpleNamespace(_resp=None))


class _Queued:
    """aiodocker's queue as compat.read_buffered sees it: (Message, size) entries."""

    def __init__(self, messages: list[tuple[int, bytes]]) -> None:
        import collections

        from aiodocker.stream import Message

        self._buffer = collections.deque((Message(fd, data), len(data)) for fd, data in messages)

    async def read(self) -> Any:
        return self._buffer.popleft()[0]


class _Stream:
    def __init__(self, messages: list[tuple[int, bytes]]) -> None:
        self._queue = _Queued(messages)

    async def read_out(self) -> Any:
        return await self._queue.read() if self._queue._buffer else None


async def test_the_agent_pipe_reads_what_has_arrived_in_one_go_in_order() -> None:
    from sandboxd.engine.docker_attach import READ_BATCH, AttachTransport

    big = b"x" * (READ_BATCH // 2)
    messages = [
        (1, b"a"),
        (1, b"b"),
        (2, b"diagnostics\n"),
        (1, b"c"),
        (1, big),
        (1, big),
        (1, b"d"),
    ]
    pipe = AttachTransport(_Stream(messages), "test")  # type: ignore[arg-type]
    got = []
    while (chunk := await pipe.read()) is not None:
        got.append(chunk)
    # stdout only, joined up to stderr and up to about READ_BATCH; nothing lost or reordered
    assert got[0] == b"ab"
    assert b"".join(got) == b"abc" + big + big + b"d"
    assert all(len(c) <= READ_BATCH + len(big) for c in got)
    assert len(got) < 6
