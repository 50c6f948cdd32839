"""Tar transfer in and out of a session's workspace: the orchestration.

Export runs `tar -c` inside the container (under the `sbx run` supervisor, whose `--cwd`
check keeps the folder inside /workspace) and forwards its stdout in chunks as it comes:
the archive is never held whole in memory, and a stream longer than the workspace cap plus
tar's overhead (a sparse file) stops with RESOURCE_EXHAUSTED. tar does not follow symlinks
when creating. Snapshots (CreateSnapshot, Suspend, the shutdown snapshot) export through here
and get the same cap. A volume the session mounts directly below /workspace is left out of the
export of the root (the other top-level names are tarred), and an import into it is refused
(IMPORT_INTO_VOLUME): the swap renames, which cannot cross into another file system; the
helper's replace spares mount points.

Import never lets an unchecked byte land where it counts. The client's stream is parsed with
Python's tarfile, forward only as it streams, on a dedicated thread (pipe.py); every member is
checked against SECURITY.md's archive rules (policy.py) and re-emitted, sanitised, to `tar -x`
in a fresh staging folder inside the workspace. Only when the whole archive was good and tar
succeeded does `sbx merge` move the staged entries into place with renameat (never through a
symlink), all or nothing: what gives way is renamed aside and everything is renamed back if
any step fails. The stage sits beside the content it replaces, so an archive is imported only
when the workspace has room for both; otherwise it is refused WORKSPACE_FULL while the old
content is untouched. Any refusal removes the staging folder: the workspace is as it was.

Every tar and helper run goes through the helper client, without the session's environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sandboxd import validation
from sandboxd.archive import compressed, policy
from sandboxd.archive.check import check_and_forward
from sandboxd.archive.pipe import (
    INBOX_BYTES,
    Cancelled,
    Inbox,
    Source,
)
from sandboxd.archive.policy import ArchiveLimits, MemberChecker
from sandboxd.archive.unpack import unpack
from sandboxd.commands import Packed
from sandboxd.engine import Engine
from sandboxd.errors import (
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SandboxError,
)
from sandboxd.files import Files
from sandboxd.helper_client import (
    STDERR_LIMIT,
    HelperClient,
    HelperResult,
    tool_argv,
    tool_error,
)
from sandboxd.models import FileType, Session, workspace_mounts
from sandboxd.reasons import Reason

log = logging.getLogger(__name__)

# Measured (export of a 48 MiB workspace to a separate client process, median of 5, twice):
# 64 KiB chunks 113-123 MB/s, 256 KiB 149-151, 1 MiB 154-159. 1 MiB once doubled the server's
# CPU per export (220-251 ms against 114-145): a 1 MiB message and its copies were just over
# malloc's mmap threshold then (sandboxd.heap), so each was a fresh mmap, faulted in and
# zeroed page by page. Under the raised threshold a 1 MiB message is a quarter of the
# per-message work (the interceptors' generators, gRPC's send and its completion, the
# digest's batch) for the same bytes: the server's CPU per 48 MiB export fell by a fifth
# (docs/performance.md).
CHUNK_BYTES = 1024 * 1024
STAGE_PREFIX = ".sbx-import-"
EMPTY_TAR = bytes(1024)  # two zero blocks: an archive of no member
LIST_BYTES = 16 * 1024 * 1024  # the listing of the workspace's top level, at most
ZPACK_FAILED = 125  # `sbx zpack`'s own failure (helper/zstd.c), not tar's status


@dataclass(frozen=True)
class ImportResult:
    files: int
    bytes: int


def _export_error(result: HelperResult, rel: str) -> SandboxError:
    """tar -c runs as the sandbox user: a file or folder that user made unreadable (000)
    cannot be carried. Said plainly (and before a Suspend stops anything), not INTERNAL."""
    if result.exit_code not in (126, 127) and "permission denied" in result.stderr_text.lower():
        return FailedPrecondition(
            f"the workspace holds an entry its user cannot read (mode 000?), so it cannot be "
            f"archived; give it read permission (chmod u+r) first: {result.stderr_text[:300]}",
            reason=Reason.WORKSPACE_UNREADABLE,
            metadata={"path": rel},
        )
    err = tool_error("export", "tar", result, rel)
    if isinstance(err, Internal) and result.exit_code in (1, 2):
        # tar ran and gave up on some entry (a path too long for it...): the workspace
        # cannot be carried as it is; said with tar's own words (their end names the cause).
        return FailedPrecondition(
            f"the workspace holds an entry that cannot be archived: ...{result.stderr_text[-400:]}",
            reason=Reason.WORKSPACE_NOT_ARCHIVABLE,
            metadata={"path": rel},
        )
    return err


def _into_volume(rel: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"{rel!r} is a volume the session mounts (another file system): an archive is not "
        "imported into it; use VolumeService.ImportVolume, or WriteFile for single files",
        reason=Reason.IMPORT_INTO_VOLUME,
        metadata={"path": rel},
    )


def _too_large(path: str, cap: int) -> ResourceExhausted:
    return ResourceExhausted(
        f"the archive of {path!r} is over {cap} bytes, more than the workspace can hold plus "
        "tar's overhead (a sparse file?)",
        reason=Reason.ARCHIVE_TOO_LARGE,
        metadata={"path": path, "limit": str(cap)},
    )


class ArchiveIO:
    """Export and import through exec; holds no per-call state."""

    def __init__(
        self,
        engine: Engine,
        files: Files,
        max_members: int = policy.DEFAULT_MAX_MEMBERS,
        helper: HelperClient | None = None,
    ) -> None:
        policy.ensure_safe_tarfile()  # start-up: no imports on a tarfile with CVE-2024-6232
        del engine  # kept in the signature: the helper client (via files) runs everything
        self._helper_client = helper or files.helper
        self._files = files
        self._max_members = max_members

    async def _is_file(self, session: Session, rel: str) -> bool:
        """Whether `rel` is a regular file (anything else exports as a folder, or fails as
        one); `sbx stat` never follows a symlink."""
        result = await self._helper_client.run(session, ["stat", rel])
        if result.exit_code != 0:
            return False  # the folder export reports what is wrong with the path
        try:
            return bool(json.loads(result.stdout.splitlines()[0]).get("type") == "file")
        except (ValueError, IndexError, AttributeError):
            return False

    async def _top_names(self, session: Session, folder: str = ".") -> list[str]:
        """The names directly in `folder` of /workspace (`sbx list`, which never follows a
        symlink)."""
        args = ["list", folder, "1"]
        result = await self._helper_client.run(session, args, max_stdout=LIST_BYTES)
        if result.exit_code != 0:
            raise _export_error(result, folder)
        names = []
        for line in result.stdout.splitlines():
            path = str(json.loads(line).get("path", ""))
            name = path.removeprefix(folder + "/") if folder != "." else path
            if name and "/" not in name:
                names.append(name)
        return names

    async def export(
        self, session: Session, path: str, compression: str = compressed.NONE
    ) -> AsyncIterator[bytes]:
        """Yields the tar of `path` in chunks as tar writes it; raises if tar fails.

        Stops with RESOURCE_EXHAUSTED (tar killed, nothing more sent) once the stream passes
        what the workspace can hold plus tar's overhead: a sparse file of 10 GiB fits a
        1 MiB tmpfs, and its archive would otherwise fill the reader's disk. With
        `compression` ZSTD, `sbx zpack` compresses inside the sandbox and holds tar's
        uncompressed output to the same cap.
        """
        rel = validation.workspace_relpath(path or ".")
        cap = policy.stream_allowance(session.spec.limits.workspace_bytes, self._max_members)
        cwd, members = rel, ["."]
        mounted = workspace_mounts(session.spec.volumes)
        if rel == "." and mounted:
            # The workspace without its volumes (folders directly below it: volumes/checks.py):
            # its other top-level entries by name. None left: an empty archive.
            kept = [n for n in await self._top_names(session) if n not in mounted]
            if not kept:
                yield compressed.compress(EMPTY_TAR) if compression else EMPTY_TAR
                return
            cwd, members = ".", [f"./{n}" for n in kept]
        elif rel != "." and await self._is_file(session, rel):
            # A single file: tar of its folder with the one member "./NAME"; the
            # folder is resolved beneath the workspace by sbx, the name archived as itself.
            parent, _, name = rel.rpartition("/")
            cwd, members = parent or ".", [f"./{name}"]
        packed = Packed(compressed.LEVEL, cap) if compression == compressed.ZSTD else None
        argv = tool_argv(cwd, ["tar", "-c", "-f", "-", *members], packed)
        stderr = bytearray()
        pending: list[bytes] = []  # joined once per chunk: one copy of each byte
        size = total = 0
        async with self._helper_client.open(session, argv) as stream:
            while (item := await stream.read_joined(CHUNK_BYTES - size)) is not None:
                fd, data = item
                if fd == 2:
                    stderr += data[: STDERR_LIMIT - len(stderr)]
                    continue
                total += len(data)
                if total > cap:
                    raise _too_large(rel, cap)
                pending.append(data)
                size += len(data)
                if size >= CHUNK_BYTES:
                    yield data if len(pending) == 1 else b"".join(pending)
                    pending.clear()
                    size = 0
            code = await stream.wait_exit_code()
        if code == ZPACK_FAILED and b'"error":"TOO_LARGE"' in stderr:
            raise _too_large(rel, cap)
        if code != 0:
            raise _export_error(HelperResult(code, b"", bytes(stderr)), rel)
        if pending:
            yield b"".join(pending)

    async def import_(
        self,
        session: Session,
        path: str,
        replace: bool,
        chunks: AsyncIterator[bytes],
        *,
        max_total_bytes: int | None = None,
        trusted: bool = False,
        compression: str = compressed.NONE,
    ) -> ImportResult:
        """Check every member, unpack into a staging folder, then merge it into place."""
        rel = validation.workspace_relpath(path or ".")
        mounted = workspace_mounts(session.spec.volumes)
        if rel.split("/", 1)[0] in mounted:
            raise _into_volume(rel)
        limits = session.spec.limits
        total = max_total_bytes or limits.workspace_bytes
        # A missing destination is made only right before the merge, and taken back if the
        # merge fails: a refused or cancelled import leaves no folder behind.
        missing = await self._missing_top(session, rel)
        existing: set[int] = (
            set() if replace or missing else await self._symlinks_under(session, rel)
        )
        checker = MemberChecker(
            ArchiveLimits(
                max_members=self._max_members,
                # The server's own snapshot holds what the sandbox made: one file may be as
                # large as the workspace; a caller's file is held to the API's file cap.
                max_file_bytes=total if trusted else limits.file_bytes,
                max_total_bytes=total,
                trusted=trusted,
            ),
            existing_hashes=existing,
        )
        stage = STAGE_PREFIX + secrets.token_hex(6)
        merged = made = False
        try:
            await self._helper(session, ["mkdir", stage], stage)
            # The new tree is staged beside the old one, which needs room for both: a stage
            # that fills the workspace is refused (NoRoom, WORKSPACE_FULL) here, before
            # anything of the old content was touched.
            members, content = await unpack(
                self._helper_client, session, stage, chunks, checker, compression
            )
            if rel == "." and mounted:  # a member in a volume's place: another file system
                clash = sorted(set(await self._top_names(session, stage)) & mounted)
                if clash:
                    raise _into_volume(clash[0])
            if missing:
                made = True
                await self._helper(session, ["mkdir", rel, "--parents"], rel)
            # All or nothing: `sbx merge` renames what gives way aside and takes it all back
            # if any step fails; it removes the stage once everything is in place.
            args = ["merge", stage, rel] + (["--replace"] if replace else [])
            await self._helper(session, args, rel)
            merged = True
        finally:
            if not merged:
                await asyncio.shield(self._remove_stage(session, stage))
                if made and missing:
                    await asyncio.shield(self._remove_stage(session, missing))
        await self._close_directories(session, rel, checker.deferred_modes)
        return ImportResult(files=members, bytes=content)

    def trusted_limits(self, session: Session) -> ArchiveLimits:
        """What a restore of the server's own snapshot of `session` is held to."""
        cap = session.spec.limits.workspace_bytes
        return ArchiveLimits(self._max_members, cap, cap, trusted=True)

    async def check_restorable(self, session: Session, chunks: AsyncIterator[bytes]) -> None:
        """Raise what a restore of this tar would refuse, before anything relies on it.

        A snapshot is checked against the trusted rules right after it is taken, while the
        session still runs: a workspace that could not come back (a name longer than any
        restore accepts...) is refused then, never found out at Resume."""
        loop = asyncio.get_running_loop()
        inbox = Inbox(loop, INBOX_BYTES)
        checker = MemberChecker(self.trusted_limits(session))

        async def feed() -> None:
            try:
                async for data in chunks:
                    await inbox.put(data)
            except BaseException:
                inbox.end(Cancelled())
                raise
            inbox.end()

        feeder = asyncio.create_task(feed())
        try:
            await asyncio.to_thread(check_and_forward, Source(inbox), None, checker)
        except InvalidArgument as exc:
            # Not the caller's argument: the workspace holds what a restore would refuse.
            raise FailedPrecondition(
                f"the workspace cannot be carried: {exc.message}",
                reason=Reason.WORKSPACE_NOT_ARCHIVABLE,
                metadata={**exc.metadata, "refused_by": exc.reason},
            ) from None
        finally:
            inbox.cancel()  # a thread still reading stops at once
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
            close = getattr(chunks, "aclose", None)  # `async for` left it open (its file)
            if close is not None:
                await close()

    async def tidy(self, session: Session) -> None:
        """Remove the staging folders of imports a dead server left behind (at start-up,
        before any import of this server can have made one): the workspace is then as it
        was before the import, as a refused one leaves it."""
        for entry in await self._files.list_dir(session, ".", 1):
            if entry.path.startswith(STAGE_PREFIX) and "/" not in entry.path:
                log.info("removing an interrupted import's staging folder %s", entry.path)
                await self._remove_stage(session, entry.path)

    async def _missing_top(self, session: Session, rel: str) -> str | None:
        """The outermost folder of `rel` that does not exist yet, None when `rel` exists."""
        if rel == ".":
            return None
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            try:
                await self._files.stat(session, prefix)
            except NotFound:
                return prefix
        return None

    async def _close_directories(
        self, session: Session, rel: str, modes: list[tuple[str, int]]
    ) -> None:
        """Give the directories unpacked open (u+rwx) their own modes, deepest first."""
        base = "" if rel == "." else rel + "/"
        for name, mode in sorted(modes, key=lambda m: -m[0].count("/")):
            where = base + name
            await self._helper(session, ["chmod", where, f"{mode:o}"], where)

    async def _symlinks_under(self, session: Session, rel: str) -> set[int]:
        """Symlinks already in the destination, relative to it: nothing may land beneath one.

        Streamed and kept as hashes: a workspace of many entries costs a few bytes each."""
        prefix = "" if rel == "." else rel + "/"
        found: set[int] = set()
        entries = self._files.walk(session, rel)
        async with contextlib.aclosing(entries):
            async for entry in entries:
                if entry.type is FileType.SYMLINK and entry.path.startswith(prefix):
                    found.add(policy.prefix_hashes(entry.path[len(prefix) :])[-1])
        return found

    async def _helper(self, session: Session, args: list[str], path: str) -> None:
        await self._helper_client.checked(session, args, path)

    async def _remove_stage(self, session: Session, stage: str) -> None:
        try:
            await self._helper(session, ["remove", stage, "--recursive"], stage)
        except SandboxError as exc:
            log.warning("could not remove import staging folder %s: %s", stage, exc)
