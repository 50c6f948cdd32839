"""A caller's ImportArchive and ExportArchive: the transfer, its SHA-256, and its one event.

The server's own snapshots and restores go through `ArchiveIO` directly; what a caller sends or
takes is also hashed, byte for byte as it crossed the API (sandboxd.digest, off the loop), and
emitted once the transfer is done (`ArchiveImported`, `ArchiveExported`): the audit log's record
is then committed before the call answers, as every domain event of a call is.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import AsyncIterator

from sandboxd import domain_events
from sandboxd.archive import compressed
from sandboxd.archive.transfer import ArchiveIO, ImportResult
from sandboxd.digest import Digest
from sandboxd.models import Session


class ArchiveCalls:
    def __init__(
        self,
        archive: ArchiveIO,
        hashers: concurrent.futures.Executor,  # the server's (digest.hashing_threads)
        observer: domain_events.Observer,
    ) -> None:
        self._archive = archive
        self._hashers = hashers
        self._observer = observer

    async def export(
        self, session: Session, path: str, compression: str = compressed.NONE
    ) -> AsyncIterator[bytes]:
        """The tar of `path` in chunks (ArchiveIO.export); the event once its last is out.

        The digest is of the bytes the caller got: compressed ones when it asked for them."""
        digest = Digest(self._hashers)
        sent = 0
        # Named only when set: a plain export is the call ArchiveIO always took.
        extra = {"compression": compression} if compression else {}
        async for data in self._archive.export(session, path, **extra):
            sent += len(data)
            await digest.update(data)  # waits when the hashing lags: the stream does too
            yield data
        self._observer.emit(
            domain_events.ArchiveExported(
                session.tenant,
                session.session_id,
                path,
                sent,
                await digest.hexdigest(),
                compression,
            )
        )

    async def import_(
        self,
        session: Session,
        path: str,
        replace: bool,
        chunks: AsyncIterator[bytes],
        compression: str = compressed.NONE,
    ) -> ImportResult:
        """ArchiveIO.import_ of the caller's chunks, hashed as the import reads them (as they
        came: compressed ones when they were)."""
        digest = Digest(self._hashers)
        taken = 0

        async def hashed() -> AsyncIterator[bytes]:
            nonlocal taken
            async for data in chunks:
                taken += len(data)
                await digest.update(data)
                yield data

        if compression:
            result = await self._archive.import_(
                session, path, replace, hashed(), compression=compression
            )
        else:  # the call ArchiveIO always took
            result = await self._archive.import_(session, path, replace, hashed())
        self._observer.emit(
            domain_events.ArchiveImported(
                session.tenant,
                session.session_id,
                path,
                replace,
                result.files,
                result.bytes,
                taken,
                await digest.hexdigest(),
                compression,
            )
        )
        return result
