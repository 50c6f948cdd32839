"""The import's unpacking: a caller's tar stream, checked member by member on a thread, into
the sandbox's own tar in a staging folder (archive/transfer.py merges the folder into place).

Three tasks and a thread: the feeder puts the caller's chunks into a bounded inbox, the
checker thread reads them (archive/check.py) and writes what passes into a bounded outbox, the
pump writes the outbox to tar's stdin, and tar's stderr is read for its refusal. Memory is
bounded by the inbox and outbox; a tar that exits early (no room) stops the pump, and its exit
status says why. A compressed archive (compressed.py) takes the same path: the feeder also
relays each chunk to `sbx zunpack`, the thread decodes what it checks and writes a recipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

from sandboxd.archive import compressed
from sandboxd.archive.check import check_and_forward
from sandboxd.archive.pipe import (
    INBOX_BYTES,
    OUTBOX_BYTES,
    Cancelled,
    Inbox,
    Outbox,
    Sink,
    SinkError,
    Source,
    join_thread,
    settle,
)
from sandboxd.archive.policy import MemberChecker
from sandboxd.commands import Unpacked
from sandboxd.errors import SandboxError
from sandboxd.futures import retrieve
from sandboxd.helper_client import HelperClient, HelperResult, drain, tool_argv, tool_error
from sandboxd.models import Session

MAX_TRAILING_BYTES = 1024 * 1024  # after the end-of-archive marker (tar pads to 10 KiB records)


async def unpack(
    helper_client: HelperClient,
    session: Session,
    stage: str,
    chunks: AsyncIterator[bytes],
    checker: MemberChecker,
    compression: str = compressed.NONE,
) -> tuple[int, int]:
    """Unpack `chunks` into `stage` with the sandbox's tar, every member checked on the way
    (`checker`, on a thread of its own, between the caller's stream and tar's stdin); the
    member count and content bytes. Refused members and a tar that fails raise; nothing
    outlives the call (the feeder, the writer, the stderr reader and the thread)."""
    loop = asyncio.get_running_loop()
    inbox, outbox = Inbox(loop, INBOX_BYTES), Outbox(loop, OUTBOX_BYTES)
    done: asyncio.Future[tuple[int, int]] = loop.create_future()
    done.add_done_callback(retrieve)
    zstd = compression == compressed.ZSTD
    argv = tool_argv(stage, ["tar", "-x", "-o", "-f", "-"], Unpacked() if zstd else None)
    stderr = bytearray()
    writing = asyncio.Lock()  # one writer at a time: the relayed records and the recipe's
    async with helper_client.open(session, argv, stdin=True) as stream:
        sink: Sink
        if zstd:
            limits = checker.limits
            cap = compressed.decoded_cap(limits.max_total_bytes, limits.max_members)
            source, sink = Source(compressed.Decoded(inbox, cap)), compressed.RecipeSink(outbox)
        else:
            source, sink = Source(inbox), Sink(outbox)

        async def relay(data: bytes) -> None:
            """The caller's compressed bytes to `sbx zunpack`, before the thread sees them:
            the recipe's records that use them can only come later."""
            for record in compressed.relay_records(data):
                async with writing:
                    if sink.gone:
                        return
                    try:
                        await stream.write(record)
                    except (SandboxError, OSError):
                        sink.tar_gone()
                        return

        async def feed() -> None:
            try:
                async for data in chunks:
                    if zstd and not inbox.discarding:
                        await relay(data)
                    await inbox.put(data)
                    if inbox.discarded > MAX_TRAILING_BYTES:
                        break  # more after the end than any tar pads with: stop waiting
            except Exception as exc:  # raised on the thread, where the data stops
                inbox.end(exc)
            except BaseException:
                inbox.end(Cancelled())  # never leave the thread waiting for more
                raise
            else:
                inbox.end()

        async def pump() -> None:
            while (items := await outbox.take()) is not None:
                for item in items:
                    if sink.gone:
                        break
                    try:
                        async with writing:
                            await stream.write(item)
                    except (SandboxError, OSError):
                        # tar exited (no room...): over the agent's channel a broken stdin
                        # is a ConnectionError; its exit status and stderr say why.
                        sink.tar_gone()

        def work() -> None:
            # The error is handed over from the except clause, which forgets it: a local
            # holding it would put this frame in a cycle with its traceback.
            try:
                counts = check_and_forward(source, sink, checker)
            except BaseException as exc:  # handed to the loop, never lost
                loop.call_soon_threadsafe(settle, done, exc)
            else:
                loop.call_soon_threadsafe(settle, done, counts)

        async def read_stderr() -> None:
            stderr.extend((await drain(stream))[1])  # tar -x prints nothing else

        reader = asyncio.create_task(read_stderr())
        writer = asyncio.create_task(pump())
        feeder = asyncio.create_task(feed())
        thread = threading.Thread(target=work, name="sandboxd-import", daemon=True)
        thread.start()
        counts: tuple[int, int] | None = None
        try:
            try:
                # tar exiting before its input ended (the reader finishing first) means a
                # write may hang until the engine drops the connection: stop writing.
                pending: list[asyncio.Future[Any]] = [done, reader]
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if not done.done():
                    sink.tar_gone()
                    writer.cancel()
                counts = await asyncio.shield(done)
                if not writer.done():
                    outbox.close()  # write what is queued, then stop
                    flushing: list[asyncio.Future[Any]] = [writer, reader]
                    await asyncio.wait(flushing, return_when=asyncio.FIRST_COMPLETED)
                    if not writer.done():
                        sink.tar_gone()
                # Nothing is merged before the client has sent all it meant to: one that
                # goes away after a complete archive has still cancelled the import.
                inbox.discard()
                await feeder
                if inbox.error is not None:
                    raise inbox.error
            except SinkError:
                pass  # tar stopped reading: its exit status and stderr say why
            finally:
                # Whatever happened, let tar see the end of its input and finish, so the
                # staging folder is quiet before anyone removes it.
                inbox.cancel()
                outbox.cancel()
                for task in (feeder, writer):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                stream.close_stdin()
                with contextlib.suppress(SandboxError, TimeoutError):
                    await asyncio.wait_for(asyncio.shield(reader), 30)
            code = await stream.wait_exit_code()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, SandboxError):
                await reader
            # The thread ends promptly once cancelled; wait so nothing outlives the call.
            await asyncio.shield(join_thread(thread))
    if code != 0 or counts is None or sink.gone:
        raise tool_error("import", "tar", HelperResult(code, b"", bytes(stderr)), stage)
    return counts
