"""The audit record's SHA-256 of an archive transfer, hashed off the event loop in batches:
the same digest as hashing every byte in order, whatever the chunk sizes and however far the
hashing threads lag."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest
from sandboxd.api import audit_describe
from sandboxd.api.audit_describe import Digest, Tally
from sandboxd.v1 import snapshot_pb2


def _chunks() -> list[bytes]:
    sizes = [1, 7, 4096, 65536, 65535, 300_000, 1, 1024 * 1024, 3 * 1024 * 1024 + 5]
    return [os.urandom(n) for n in sizes * 3]


@pytest.mark.parametrize("batch", [1, 1000, 64 * 1024, audit_describe.HASH_BATCH])
async def test_digest_matches_hashing_in_order(monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    monkeypatch.setattr(audit_describe, "HASH_BATCH", batch)
    chunks = _chunks()
    digest = Digest()
    for chunk in chunks:
        digest.update(chunk)
    assert await digest.hexdigest() == hashlib.sha256(b"".join(chunks)).hexdigest()


async def test_lagging_threads_bound_the_batches_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Threads that do not get to run: the loop waits for the oldest batch rather than hold
    more than the backlog, and the digest is still every byte in order."""
    gate = threading.Event()
    real = audit_describe._hash_after
    most = 0

    def slow(*args: object) -> None:
        gate.wait()
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(audit_describe, "HASH_BATCH", 10)
    monkeypatch.setattr(audit_describe, "_hash_after", slow)
    digest = Digest()
    chunks = [os.urandom(10) for _ in range(3 * audit_describe.HASH_BACKLOG)]
    releaser = threading.Timer(0.2, gate.set)
    releaser.start()
    try:
        for chunk in chunks:
            digest.update(chunk)
            most = max(most, len(digest._inflight))
    finally:
        gate.set()
        releaser.cancel()
    assert most <= audit_describe.HASH_BACKLOG
    assert await digest.hexdigest() == hashlib.sha256(b"".join(chunks)).hexdigest()


async def test_import_and_export_records_carry_the_digest_once_settled() -> None:
    data = [os.urandom(200_000) for _ in range(12)]
    expected = hashlib.sha256(b"".join(data)).hexdigest()

    imp = Tally("SnapshotService/ImportArchive")
    imp.request(snapshot_pb2.ImportArchiveRequest(header={"session_id": "s", "path": "."}))
    for chunk in data:
        imp.request(snapshot_pb2.ImportArchiveRequest(data=chunk))
    assert imp.reply(snapshot_pb2.ImportArchiveResponse(files=1, bytes=5))
    await imp.settle()
    assert imp.attributes["sha256"] == expected
    assert imp.attributes["tar_bytes"] == sum(map(len, data))

    exp = Tally("SnapshotService/ExportArchive")
    exp.request(snapshot_pb2.ExportArchiveRequest(session_id="s", path="."))
    for chunk in data:
        assert not exp.reply(snapshot_pb2.ExportArchiveResponse(chunk={"data": chunk}))
    exp.ended()
    await exp.settle()
    assert exp.attributes["sha256"] == expected
    assert exp.attributes["tar_bytes"] == sum(map(len, data))
