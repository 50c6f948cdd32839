"""Suspend with memory: a gVisor session's processes and memory checkpointed with its workspace,
and resumed where they were.

Why a module of its own: the filesystem suspend (`suspension.py`) tars the workspace and
removes the sandbox; this path adds a checkpoint of the whole sandbox (runsc's, through the
engine: `Engine.checkpoint_sandbox`) and restores it into a new sandbox of the same shape. The
tmpfs workspace is memory of the sandbox, so it comes back with the checkpoint; the agent (PID
1) holds the background processes' rings, so AttachProcess replays and follows them after a
resume, once the server has adopted them again (the `on_resume` hooks).

Nothing lost, in order:
1. Refused before anything is stopped (MEMORY_SUSPEND_UNSUPPORTED): a runc session, an engine
   that cannot checkpoint (`Engine.memory_checkpoints`), a server without a checkpoint store.
2. A filesystem snapshot is taken first (the net under the rest).
3. The checkpoint (the point of no return: the sandbox stops). One that fails with the sandbox
   still running leaves the session RUNNING and says so; one that fails with it stopped, or a
   copy of the image into the server's store that fails, leaves the session SUSPENDED from its
   filesystem snapshot (suspend_mode FILESYSTEM), and says so.
4. Resume restores the stored checkpoint (its sha256 checked as it streams) into a new sandbox;
   a restore that fails takes its sandbox back and keeps the checkpoint for another try. One
   whose bytes do not match their digest is dropped and the session resumes, next time, from
   its filesystem snapshot: an altered image is never started.

The lease does not count the time suspended: a resume moves its end on by that time.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from sandboxd.engine.protocol import Engine
from sandboxd.errors import FailedPrecondition, Internal, SandboxError
from sandboxd.isolation import Isolation
from sandboxd.labels import LABEL_AUTO
from sandboxd.models import Session, SessionState, SuspendMode
from sandboxd.reasons import Reason
from sandboxd.sessions.keeper import WorkspaceKeeper
from sandboxd.sessions.sandboxes import Sandboxes, Undo
from sandboxd.snapshot_store import KIND_MEMORY, Snapshot, new_snapshot
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)

CHECKPOINT_LABEL = "memory_checkpoint"  # the engine's name of the checkpoint, on its record
ResumeHook = Callable[[Session], Awaitable[object]]
# (tenant, bytes a checkpoint may take): raises the tenant's quota refusal when it has no room.
RoomCheck = Callable[[str, int], Awaitable[None]]


class CheckpointStore(Protocol):
    """Where checkpoints are kept: content-addressed beside the snapshots (SnapshotStore)."""

    async def add(self, chunks: AsyncIterator[bytes], snap: Snapshot) -> Snapshot: ...

    def read(self, sha256: str) -> AsyncIterator[bytes]: ...

    async def memory_of(self, session_id: str) -> Snapshot | None: ...

    async def delete(self, snapshot_id: str) -> Snapshot | None: ...


def unsupported(session_id: str, why: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"session {session_id!r} cannot be suspended with its memory: {why}; its sandbox was "
        "not stopped (a filesystem suspend keeps the workspace)",
        reason=Reason.MEMORY_SUSPEND_UNSUPPORTED,
        metadata={"session_id": session_id},
    )


def _failed(exc: SandboxError, what: str, state: SessionState, kept: SuspendMode) -> SandboxError:
    """The engine's failure, of its own class, saying what the session is now."""
    message = f"{exc.message}; {what}"
    metadata = {**exc.metadata, "session_state": state.value, "suspend_mode": kept.value}
    try:
        out = type(exc)(message, reason=exc.reason, metadata=metadata)
    except TypeError:  # a class of its own signature: the code becomes INTERNAL's
        out = Internal(message, reason=exc.reason, metadata=metadata)
    out.__cause__ = exc
    return out


class AlteredCheckpoint(Internal):
    """The stored checkpoint's bytes are not the ones recorded."""


async def _verified(chunks: AsyncIterator[bytes], sha256: str) -> AsyncIterator[bytes]:
    """`chunks` as they come, and a refusal instead of the end if their digest differs: the
    engine's upload then fails, so the altered image is never started."""
    digest = hashlib.sha256()
    async for chunk in chunks:
        digest.update(chunk)
        yield chunk
    if digest.hexdigest() != sha256:
        raise AlteredCheckpoint("the stored checkpoint does not match its recorded digest")


@dataclass(frozen=True)
class MemoryOptions:
    """What the server gives memory suspends: where checkpoints are kept (None: nowhere, so no
    memory suspend), what runs after a resume (the processes' adoption), the quota's check."""

    checkpoints: CheckpointStore | None = None
    on_resume: Sequence[ResumeHook] = ()
    room: RoomCheck | None = None


class MemorySuspension:
    def __init__(
        self,
        engine: Engine,
        store: SessionStore,
        keeper: WorkspaceKeeper,
        sandboxes: Sandboxes,
        options: MemoryOptions,
    ) -> None:
        self._engine = engine
        self._store = store
        self._checkpoints = options.checkpoints
        self._keeper = keeper
        self._sandboxes = sandboxes
        self._on_resume = list(options.on_resume)
        self._room = options.room  # None: no quota

    async def why_not(self, session: Session | None = None) -> str:
        """Empty when a memory suspend can be had (of `session`, or of a gVisor session)."""
        if self._checkpoints is None:
            return "this server keeps no checkpoints"
        if session is not None and session.spec.isolation is not Isolation.GVISOR:
            return (
                f"it runs under {session.spec.isolation.value}, and only gVisor sessions can "
                "be checkpointed"
            )
        if session is not None and (session.spec.on_disk or session.spec.volumes):
            # The checkpoint carries the sandbox's memory and its tmpfs; a disk or a volume
            # mounted from the host is not in it, and its restore into a new sandbox is not
            # yet proven: refused up front rather than risked.
            return "its workspace is on disk or it mounts volumes: a checkpoint carries neither"
        return await self._engine.memory_checkpoints()

    async def suspend(self, session: Session) -> Session:
        """Under the session's lock and its exclusive workspace gate (the caller's)."""
        why = await self.why_not(session)
        if why or self._checkpoints is None:
            raise unsupported(session.session_id, why)
        if self._room is not None:  # before anything stops, as the refusal above
            await self._room(session.tenant, session.spec.limits.memory_bytes)
        fs = await self._keeper.take(session, {LABEL_AUTO: "suspend"})
        sandbox_id = session.container_id
        name = "sbx-" + secrets.token_hex(6)
        try:
            await self._engine.checkpoint_sandbox(sandbox_id, name)
        except SandboxError as exc:
            status = await self._engine.inspect_sandbox(sandbox_id)
            if status is not None and status.running:
                raise _failed(
                    exc,
                    "the checkpoint was not taken and the session runs on as it was",
                    SessionState.RUNNING,
                    SuspendMode.NONE,
                ) from exc
            await self._settle(session, SuspendMode.FILESYSTEM)
            raise _failed(
                exc,
                f"the session is suspended from its filesystem snapshot {fs.snapshot_id} "
                "(its processes did not survive)",
                SessionState.SUSPENDED,
                SuspendMode.FILESYSTEM,
            ) from exc
        labels = {CHECKPOINT_LABEL: name}
        record = new_snapshot(session.session_id, session.tenant, KIND_MEMORY, labels)
        try:
            await self._checkpoints.add(self._engine.read_checkpoint(sandbox_id, name), record)
        except (SandboxError, OSError) as exc:
            await self._settle(session, SuspendMode.FILESYSTEM)
            err = exc if isinstance(exc, SandboxError) else Internal(f"storing: {exc}")
            raise _failed(
                err,
                f"the checkpoint could not be stored; the session is suspended from its "
                f"filesystem snapshot {fs.snapshot_id} (its processes did not survive)",
                SessionState.SUSPENDED,
                SuspendMode.FILESYSTEM,
            ) from exc
        await self._settle(session, SuspendMode.MEMORY)
        log.info(
            "session suspended with its memory (%d bytes)",
            record.size_bytes,
            extra={"session_id": session.session_id, "snapshot_id": record.snapshot_id},
        )
        return session

    async def _settle(self, session: Session, kept: SuspendMode) -> None:
        """The stopped sandbox goes (its checkpoint is the server's now); SUSPENDED."""
        await asyncio.shield(self._sandboxes.teardown(session, quiet=True, keep_network=True))
        session.state = SessionState.SUSPENDED
        session.suspend_mode = kept
        session.container_id = ""
        await self._store.update(session)

    async def checkpoint_of(self, session: Session) -> Snapshot | None:
        """The checkpoint a resume of `session` restores, if its suspension kept one."""
        if session.suspend_mode is not SuspendMode.MEMORY or self._checkpoints is None:
            return None
        return await self._checkpoints.memory_of(session.session_id)

    async def resume(self, session: Session, checkpoint: Snapshot) -> Session:
        """A new sandbox of the session's shape, started from `checkpoint` (under the lock)."""
        assert self._checkpoints is not None  # checkpoint_of found one
        store = self._checkpoints
        name = checkpoint.labels.get(CHECKPOINT_LABEL, "")

        async def start(sandbox_id: str) -> None:
            chunks = _verified(store.read(checkpoint.sha256), checkpoint.sha256)
            await self._engine.restore_sandbox(sandbox_id, name, chunks)

        await self._sandboxes.teardown(session, keep_network=True)
        undo = Undo()
        try:
            await self._sandboxes.provision(session, undo, warm_ok=False, start=start)
        except BaseException as exc:
            await asyncio.shield(self._undo(session, undo))
            if isinstance(exc, AlteredCheckpoint) or isinstance(exc.__cause__, AlteredCheckpoint):
                await self._drop_altered(session, checkpoint)
            raise
        resumed = datetime.now(tz=UTC)
        paused = resumed - checkpoint.created_at
        session.lease_expires_at += paused  # the time suspended is not the lease's
        pause = (checkpoint.created_at.timestamp(), resumed.timestamp())
        session.pauses = (*session.pauses, pause)  # nor its processes' timeouts
        session.state = SessionState.RUNNING
        session.suspend_mode = SuspendMode.NONE
        await self._store.update(session)
        await store.delete(checkpoint.snapshot_id)  # consumed: the session runs on from here
        for hook in self._on_resume:
            await hook(session)
        log.info(
            "session resumed with its memory after %.1f s",
            paused.total_seconds(),
            extra={"session_id": session.session_id},
        )
        return session

    async def _undo(self, session: Session, undo: Undo) -> None:
        await undo.run()
        session.state = SessionState.SUSPENDED
        session.container_id = ""
        await self._store.update(session)

    async def _drop_altered(self, session: Session, checkpoint: Snapshot) -> None:
        log.error(
            "checkpoint %s of %s was altered on disk; dropped, the next resume uses the "
            "filesystem snapshot",
            checkpoint.snapshot_id,
            session.session_id,
        )
        if self._checkpoints is not None:
            await self._checkpoints.delete(checkpoint.snapshot_id)
        session.suspend_mode = SuspendMode.FILESYSTEM
        await self._store.update(session)
