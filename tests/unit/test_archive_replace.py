"""A replace import whose archive fits only without the old content, driven through ArchiveIO
with a scripted helper in place of the sandbox: the `tar -x` runs out of room, and its stdin
breaks the way the agent's channel breaks it (ConnectionError, not a domain error)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import tarfile
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from sandboxd.archive import ArchiveIO
from sandboxd.helper_client import HelperResult, NoRoom

from tests.engine_contract import running_session


class TarStream:
    """One `tar -x`: `full` makes it run out of room after its first write."""

    def __init__(self, full: bool) -> None:
        self.exec_id = "e"
        self.full = full
        self.stdin = bytearray()
        self.writes = 0
        self._gone = asyncio.Event()
        self._stderr_sent = False

    async def write(self, data: bytes) -> None:
        self.writes += 1
        if self.full and self.writes > 1:
            self._gone.set()  # tar died of ENOSPC: the agent reports the stream ended
            raise ConnectionError("stdin of the command: the stream has ended")
        self.stdin += data
        await asyncio.sleep(0)

    def close_stdin(self) -> None:
        self._gone.set()

    async def read(self) -> tuple[int, bytes] | None:
        await self._gone.wait()  # tar's stderr arrives only after the write broke
        if self.full and not self._stderr_sent:
            self._stderr_sent = True
            return 2, b"tar: write error: No space left on device\n"
        return None

    async def wait_exit_code(self) -> int:
        await self._gone.wait()
        return 1 if self.full else 0


class Helper:
    def __init__(self) -> None:
        self.tars: list[TarStream] = []
        self.ran: list[list[str]] = []

    @contextlib.asynccontextmanager
    async def open(
        self, target: Any, args: Sequence[str], *, stdin: bool = False
    ) -> AsyncIterator[TarStream]:
        stream = TarStream(full=not self.tars)
        self.tars.append(stream)
        yield stream

    async def checked(self, target: Any, args: Sequence[str], path: str) -> HelperResult:
        self.ran.append(list(args))
        return HelperResult(0, b"", b"")


def _archive() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(8):
            info = tarfile.TarInfo(f"f{i}")
            info.size = 200_000
            tar.addfile(info, io.BytesIO(bytes([65 + i]) * info.size))
    return buf.getvalue()


async def test_a_replace_that_runs_out_of_room_is_refused_before_the_old_content_is_touched() -> (
    None
):
    """The new tree is staged beside the old one: a stage that fills the workspace ends the
    import WORKSPACE_FULL with the stage removed and nothing merged (an earlier version
    emptied the destination to unpack again, and a second failure left it empty)."""
    helper = Helper()
    archive = ArchiveIO(None, None, helper=helper)  # type: ignore[arg-type]
    data = _archive()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 64 * 1024):
            yield data[i : i + 64 * 1024]

    with pytest.raises(NoRoom) as exc:
        await archive.import_(running_session(), ".", True, chunks())
    assert exc.value.reason == "WORKSPACE_FULL"
    assert len(helper.tars) == 1  # no second unpack
    stage = helper.ran[0][1]
    assert not any(args[0] == "merge" for args in helper.ran), helper.ran
    assert helper.ran[-1] == ["remove", stage, "--recursive"]


class BrokenTar(TarStream):
    """A `tar -x` that fails for a reason other than room (no second try from the spool)."""

    async def read(self) -> tuple[int, bytes] | None:
        await self._gone.wait()
        if not self._stderr_sent:
            self._stderr_sent = True
            return 2, b"tar: invalid tar magic\n"
        return None


class StuckCleanup(Helper):
    """`tar -x` fails; the staging folder's removal then waits until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.removing = asyncio.Event()
        self.release = asyncio.Event()

    @contextlib.asynccontextmanager
    async def open(
        self, target: Any, args: Sequence[str], *, stdin: bool = False
    ) -> AsyncIterator[TarStream]:
        stream = BrokenTar(full=True)
        self.tars.append(stream)
        yield stream

    async def checked(self, target: Any, args: Sequence[str], path: str) -> HelperResult:
        if args[0] == "remove":
            self.removing.set()
            await self.release.wait()  # an engine slow to answer
        return await super().checked(target, args, path)


async def test_a_failed_import_cancelled_during_its_clean_up_still_removes_the_stage() -> None:
    """A call cancelled while its failed import removes the staging folder: the removal is
    shielded and finishes (the workspace is left as it was), the call ends cancelled."""
    helper = StuckCleanup()
    archive = ArchiveIO(None, None, helper=helper)  # type: ignore[arg-type]
    data = _archive()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 64 * 1024):
            yield data[i : i + 64 * 1024]

    call = asyncio.create_task(archive.import_(running_session(), ".", True, chunks()))
    await asyncio.wait_for(helper.removing.wait(), 10)
    call.cancel()
    helper.release.set()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(call, 10)
    for _ in range(100):
        if helper.ran and helper.ran[-1][0] == "remove":
            break
        await asyncio.sleep(0.01)
    assert helper.ran[-1][0] == "remove"
    assert not any(args[0] == "merge" for args in helper.ran)
