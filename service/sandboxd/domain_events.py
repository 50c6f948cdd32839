"""What the domain tells the rest of the server: typed events into one observer.

Cross-cutting work (the audit log, the sessions' event feed, lease renewal on activity, the
per-tenant metrics) follows what happened, not which RPC asked for it: the code that runs a
command, writes a file or publishes a port emits one event, once, and each subscriber takes
the events it cares about. The observer is passed to the constructors (server/parts.py wires
it) rather than reached through a global, and an emit never blocks: subscribers that must
finish something before the call answers (the audit writer's commit) hand it to the call's
`CallScope`, which the gRPC edge settles before it passes the answer on.

This module is a leaf: it imports nothing of the server, so every room can emit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

from sandboxd.futures import retrieve

log = logging.getLogger(__name__)


# The events -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommandStarted:
    """A command runs in a session (Exec, Run, Interact, StartProcess; `origin` says which).

    Told once per process: a StartProcess retried with its request_id (or process id) that
    finds the process already there starts nothing and tells nothing. `cwd` is the directory
    it runs in (resolved against /workspace), `pty` whether it runs on a terminal, and
    `request_id` the caller's retry key, if it gave one."""

    tenant: str
    session_id: str
    process_id: str
    argv: tuple[str, ...]
    origin: str  # a ProcessOrigin value: exec, run, interact, start_process
    background: bool = False
    cwd: str = ""
    pty: bool = False
    request_id: str = ""


@dataclass(frozen=True)
class CommandExited:
    """A command ended (killed with its call, too: exit 137, SIGKILL).

    `stdout_bytes` and `stderr_bytes` are what the command wrote within its output cap
    (`truncated`: it wrote more), counted where the server read it: before any cut of a reply
    to the caller's max_reply_bytes."""

    tenant: str
    session_id: str
    process_id: str
    argv: tuple[str, ...]
    cwd: str
    origin: str
    exit_code: int
    signal: str
    timed_out: bool
    duration_s: float
    background: bool = False
    truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    pty: bool = False


@dataclass(frozen=True)
class ProcessInputSent:
    """SendProcessInput's bytes reached a background process's stdin (`closed`: its end)."""

    tenant: str
    session_id: str
    process_id: str
    bytes: int = 0
    closed: bool = False


@dataclass(frozen=True)
class ProcessSignalled:
    """SignalProcess's signal (by name, however the caller spelled it) was sent."""

    tenant: str
    session_id: str
    process_id: str
    signal: str


@dataclass(frozen=True)
class FileWritten:
    """A file was written whole (WriteFile, WriteFileStream); `path` and `mode` as the caller
    gave them, `bytes` what it sent, `size` the file's size after."""

    tenant: str
    session_id: str
    path: str
    bytes: int
    mode: int
    size: int


@dataclass(frozen=True)
class DirectoryMade:
    tenant: str
    session_id: str
    path: str


@dataclass(frozen=True)
class FileRemoved:
    tenant: str
    session_id: str
    path: str
    recursive: bool


@dataclass(frozen=True)
class FileMoved:
    tenant: str
    session_id: str
    source: str
    destination: str
    overwrite: bool
    size: int


@dataclass(frozen=True)
class PortPublished:
    tenant: str
    session_id: str
    port: int
    public: bool
    expires_at: float


@dataclass(frozen=True)
class PortUnpublished:
    tenant: str
    session_id: str
    port: int


@dataclass(frozen=True)
class TemplateBuilt:
    tenant: str
    name: str
    image: str
    size_bytes: int


@dataclass(frozen=True)
class TemplateDeleted:
    tenant: str
    name: str


@dataclass(frozen=True)
class ImagePulled:
    """A PullImage call saw its image present (pulled now, or already there)."""

    tenant: str
    image: str
    digest: str


@dataclass(frozen=True)
class Swept:
    """One sweep ran (the Sweep RPC's, or the server's own every interval)."""

    tenant: str
    expired_sessions: int
    removed_containers: int
    removed_images: int
    removed_networks: int
    removed_volume_disks: int


@dataclass(frozen=True)
class VolumeMoved:
    """A volume's tar was taken in (ImportVolume, `imported`) or handed out (ExportVolume)."""

    tenant: str
    volume_id: str
    imported: bool
    tar_bytes: int
    replace: bool = False


@dataclass(frozen=True)
class ArchiveExported:
    """ExportArchive's tar went out whole: its size and SHA-256 as the caller received it
    (the compressed stream when `compression` names one)."""

    tenant: str
    session_id: str
    path: str
    tar_bytes: int
    sha256: str
    compression: str = ""


@dataclass(frozen=True)
class ArchiveImported:
    """ImportArchive's tar was merged into the workspace: `files` and `bytes_written` of its
    content, `tar_bytes` and `sha256` of the stream as the caller sent it (compressed when
    `compression` names one)."""

    tenant: str
    session_id: str
    path: str
    replace: bool
    files: int
    bytes_written: int
    tar_bytes: int
    sha256: str
    compression: str = ""


@dataclass(frozen=True)
class SessionActed:
    """A caller's change of a session went through: created (a fork too: `from_snapshot_id`),
    deleted (`existed`: whether this call removed it; deleting is idempotent), its lease renewed,
    suspended, resumed, or its network policy updated (`action` says which, as the audit log
    names it)."""

    tenant: str
    session_id: str
    action: str  # create, delete, renew, suspend, resume, update_network_policy
    image: str = ""  # create: the image the session runs
    from_snapshot_id: str = ""
    existed: bool = True


@dataclass(frozen=True)
class SnapshotTaken:
    """CreateSnapshot stored a snapshot of a session's workspace (`image`: a committed image's)."""

    tenant: str
    session_id: str
    snapshot_id: str
    size_bytes: int
    sha256: str
    image: str


@dataclass(frozen=True)
class SnapshotDeleted:
    tenant: str
    snapshot_id: str


@dataclass(frozen=True)
class VolumeCreated:
    tenant: str
    volume_id: str
    size_bytes: int


@dataclass(frozen=True)
class VolumeDeleted:
    """DeleteVolume ran (`existed`: whether this call removed it; deleting is idempotent)."""

    tenant: str
    volume_id: str
    existed: bool


@dataclass(frozen=True)
class EgressDecided:
    """An egress proxy's decision, or a secret's injection (`kind`), never blocking it."""

    tenant: str
    session_id: str
    time: float
    kind: str  # egress, secret_injected, secret_misdirected
    method: str
    host: str
    port: int
    allowed: bool
    reason: str
    address: str = ""
    secret: str = ""


@dataclass(frozen=True)
class CallRefused:
    """The API refused a call (any non-OK status): the one event the gRPC edge emits, with
    the status's code name and, when it carried one, its ErrorInfo reason and message."""

    tenant: str
    session_id: str
    code: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class SessionChanged:
    """A session's state changed as the session store recorded it."""

    tenant: str
    session_id: str
    state: str  # a SessionState value


DomainEvent = (
    CommandStarted
    | CommandExited
    | ProcessInputSent
    | ProcessSignalled
    | FileWritten
    | DirectoryMade
    | FileRemoved
    | FileMoved
    | PortPublished
    | PortUnpublished
    | TemplateBuilt
    | TemplateDeleted
    | ImagePulled
    | Swept
    | VolumeMoved
    | ArchiveExported
    | ArchiveImported
    | SessionActed
    | SnapshotTaken
    | SnapshotDeleted
    | VolumeCreated
    | VolumeDeleted
    | EgressDecided
    | CallRefused
    | SessionChanged
)


# The observer ---------------------------------------------------------------------------------


class Observer(Protocol):
    def emit(self, event: DomainEvent) -> None: ...


Subscriber = Callable[[DomainEvent], None]


class FanOut:
    """Every event to each subscriber, in the order they were registered (at composition).

    A subscriber's failure is logged and never reaches the emitter: the command ran, the file
    was written, whatever a bystander made of it."""

    def __init__(self, subscribers: Sequence[Subscriber] = ()) -> None:
        self._subscribers = list(subscribers)

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    def emit(self, event: DomainEvent) -> None:
        for subscriber in self._subscribers:
            try:
                subscriber(event)
            except Exception:
                log.exception("a subscriber failed on %s", type(event).__name__)


class Silent:
    """No one listens (a part used on its own: a test, a tool)."""

    def emit(self, event: DomainEvent) -> None:
        return None


SILENT: Observer = Silent()


# The call an event happens in -----------------------------------------------------------------


@dataclass(slots=True)
class CallScope:
    """The RPC the running task serves: set by the gRPC edge, read by subscribers.

    `pending` is what subscribers must see done before the call answers (the audit writer's
    acknowledgements): the edge awaits `settle` before it passes each outcome on. Once the
    call has answered (`open` false) nothing more is deferred to it: a task it started and
    that outlives it (a background process) makes events of its own, not of that call."""

    method: str  # Service/Method, without the package
    trace_id: str = ""
    open: bool = True
    pending: list[asyncio.Future[object]] = field(default_factory=list)

    def defer(self, work: Awaitable[object]) -> bool:
        """Make `work` part of this call's answer; False once the call has answered."""
        if not self.open:
            return False
        self.pending.append(asyncio.ensure_future(work))
        return True

    async def settle(self) -> None:
        """Until every deferred piece is done; the first failure is raised (after all ended)."""
        while self.pending:
            batch, self.pending = self.pending, []
            if len(batch) == 1:  # the common case (a Run's one record): no gather around it
                await batch[0]
                continue
            results = await asyncio.gather(*batch, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result

    def close(self) -> None:
        """The call answered: later events are not its own. What it left pending runs on."""
        self.open = False
        for task in self.pending:
            task.add_done_callback(retrieve)
        self.pending = []


CURRENT_SCOPE: ContextVar[CallScope | None] = ContextVar("sandboxd_call_scope", default=None)


def current_call() -> CallScope | None:
    """The scope of the call this task serves, while it has not answered; else None."""
    scope = CURRENT_SCOPE.get()
    return scope if scope is not None and scope.open else None


def outside_calls() -> None:
    """This task (a background process, the reaper) is no call's, whatever started it."""
    CURRENT_SCOPE.set(None)
