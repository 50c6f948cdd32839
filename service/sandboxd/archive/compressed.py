"""Compressed archives (zstd): the server relays compressed bytes and still checks every member.

Export: `sbx zpack` inside the sandbox compresses tar's output (and holds it to the same
uncompressed cap as a plain export); the server forwards the frames as they come.

Import: the caller's compressed chunks go two ways. Each is relayed as it came to `sbx zunpack`
in the staging folder (a 'Z' record), and queued for the import thread, which decodes it
(`Decoded`, zstandard's streaming reader: bounded output, on the thread, off the loop) and
parses the tar with the same checks as a plain import (check.py, policy.py). What the thread
writes is not the archive but a recipe (`RecipeSink`): the headers it wrote for the checked
members as literals ('L'), and which decoded byte ranges are member content to copy ('C') or
the caller's own headers and padding to skip ('S'). `sbx zunpack` decodes the relayed bytes
itself and feeds tar only what the recipe says, so tar sees exactly the stream a plain import
would give it: the server's headers and checked content, never a byte of the caller's
headers. The relayed bytes always precede the records that use them (one writer, in order),
so the agent never waits for a record the server has not sent.

The zstd decoders on both sides are held to an 8 MiB window, and the decoded stream to what
the import could ever unpack (`decoded_cap`): a small compressed archive cannot make the
server or the sandbox decode gigabytes.

`zstandard` is loaded by the first compressed import or the first compressed empty archive, not
at start-up: an idle server, and one that only moves plain tar, never maps it.
"""

from __future__ import annotations

import struct
from typing import Protocol

from sandboxd.archive import policy
from sandboxd.archive.pipe import OUT_BATCH, Outbox, Sink
from sandboxd.errors import InvalidArgument, ResourceExhausted
from sandboxd.reasons import Reason

NONE = ""
ZSTD = "zstd"
LEVEL = 1  # the fastest level: the server relays, so the sandbox's CPU is what it costs
WINDOW_BYTES = 1 << 23  # the helper's WINDOW_LOG_MAX (helper/zstd.c)
DECODE_BYTES = 256 * 1024  # the most one read of the decoder returns
RELAY_BYTES = 1024 * 1024  # a caller's chunk is relayed in records of at most this size

_HEAD = struct.Struct(">cI")
_COUNT = struct.Struct(">cIQ")


def invalid(why: str) -> InvalidArgument:
    return InvalidArgument(
        f"the compressed archive is not valid zstd ({why})",
        reason=Reason.ARCHIVE_COMPRESSION_INVALID,
    )


def relay_records(data: bytes) -> list[bytes]:
    """The caller's compressed `data` as 'Z' records for `sbx zunpack`."""
    if len(data) <= RELAY_BYTES:
        return [_HEAD.pack(b"Z", len(data)) + data]
    view = memoryview(data)
    return [
        _HEAD.pack(b"Z", len(view[i : i + RELAY_BYTES])) + view[i : i + RELAY_BYTES]
        for i in range(0, len(data), RELAY_BYTES)
    ]


def compress(data: bytes) -> bytes:
    """A small archive the server makes itself (the empty one), compressed as the helper would."""
    import zstandard

    return zstandard.ZstdCompressor(level=LEVEL, write_checksum=True).compress(data)


class _Chunks(Protocol):
    def get(self) -> bytes | None: ...


class _Raw:
    """The queued compressed chunks as the file-like zstandard's reader pulls from."""

    def __init__(self, chunks: _Chunks) -> None:
        self._chunks = chunks

    def read(self, n: int = -1) -> bytes:
        del n  # a whole queued chunk: the reader takes any length
        return self._chunks.get() or b""


class Decoded:
    """What the import thread's Source reads (`get`, as an Inbox): the decoded tar, in pieces
    of at most DECODE_BYTES, None at the end; at most `cap` bytes in all."""

    def __init__(self, chunks: _Chunks, cap: int) -> None:
        import zstandard

        self._error = zstandard.ZstdError
        decoder = zstandard.ZstdDecompressor(max_window_size=WINDOW_BYTES)
        self._reader = decoder.stream_reader(
            _Raw(chunks),  # type: ignore[arg-type]  # a read() is all it calls
            read_size=DECODE_BYTES,
            read_across_frames=True,
            closefd=False,
        )
        self._cap = cap
        self.decoded = 0

    def get(self) -> bytes | None:
        try:
            data = self._reader.read(DECODE_BYTES)
        except self._error as exc:
            raise invalid(str(exc)) from None
        if not data:
            return None
        self.decoded += len(data)
        if self.decoded > self._cap:
            raise ResourceExhausted(
                f"the compressed archive decodes to more than {self._cap} bytes, more than "
                "the workspace can hold plus tar's overhead",
                reason=Reason.WORKSPACE_FULL,
                metadata={"limit": str(self._cap)},
            )
        return data


def decoded_cap(max_total_bytes: int, max_members: int) -> int:
    """The most decoded bytes an import reads: what it may write, plus the caller's own
    headers (at most one extended record and a header block per member, as policy.py caps
    them) and what a tar pads its end with."""
    headers = max_members * (policy.MAX_EXTENDED_HEADER_BYTES + 3 * 512)
    return policy.stream_allowance(max_total_bytes, max_members) + headers + (1 << 20)


class RecipeSink(Sink):
    """The import thread's output for `sbx zunpack`: the records that rebuild the sanitised
    archive from the decoded stream (literal headers, content to copy, the rest skipped).

    Counts against `limit` exactly what a plain Sink would write; hands records to the outbox
    once they stand for OUT_BATCH bytes of tar's input, as a plain Sink does its bytes."""

    def __init__(self, outbox: Outbox) -> None:
        super().__init__(outbox)
        self._literal = bytearray()
        self._records: list[bytes] = []
        self._taken = 0  # decoded bytes the records so far copy or skip
        self._copy = 0  # a copy being extended (contiguous content), not yet a record
        self._represented = 0  # tar's input the pending records stand for

    def write(self, data: bytes | memoryview) -> None:
        self._account(len(data))
        self._end_copy()
        self._literal += data
        self._represented += len(data)
        if self._represented >= OUT_BATCH:
            self.flush()

    def content(self, view: memoryview, start: int) -> None:
        self._account(len(view))
        self._end_literal()
        if start != self._taken + self._copy:
            self._end_copy()
            if start < self._taken:
                raise AssertionError("content before what was already taken")
            self._records.append(_COUNT.pack(b"S", 8, start - self._taken))
            self._taken = start
        self._copy += len(view)
        self._represented += len(view)
        if self._represented >= OUT_BATCH:
            self.flush()

    def _end_literal(self) -> None:
        if self._literal:
            self._records.append(_HEAD.pack(b"L", len(self._literal)) + self._literal)
            self._literal = bytearray()

    def _end_copy(self) -> None:
        if self._copy:
            self._records.append(_COUNT.pack(b"C", 8, self._copy))
            self._taken += self._copy
            self._copy = 0

    def flush(self) -> None:
        self._end_literal()
        self._end_copy()
        if not self._records:
            return
        payload = b"".join(self._records)
        self._records, self._represented = [], 0
        self._put(payload)
