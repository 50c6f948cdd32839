"""What keeps the replies of each RPC within the caller's limit (api/replies.py): one entry per
RPC of every sandboxd.v1 service, checked against the descriptors by
tests/unit/test_reply_bounds.py, so a new RPC cannot be added without saying how its replies
stay small. Under all of them `ReplyLimit` refuses any reply message still over the limit.

The kinds:
- FIXED: one reply made of what the server bounded when it took it in (ids, paths of at most
  4 KiB, argv of at most 256 KiB, 64 labels, 256 domains...): far under MIN_REPLY_BYTES.
- CUT: output cut to fit, with `truncated` set (Run).
- REFUSED: refused before the work when it would not fit, naming the RPC that streams it.
- PAGED: a page cut short to fit (next_page_token continues after it); where page_size 0 means
  "all in one reply", one that would not fit is refused.
- CHUNKED: a stream whose data messages are cut at a fixed size (`per_message`).
- EVENTS: a stream of small messages, each bounded by what the server puts in it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sandboxd.archive.transfer import CHUNK_BYTES as ARCHIVE_CHUNK_BYTES
from sandboxd.execution import CHUNK_BYTES as OUTPUT_CHUNK_BYTES
from sandboxd.file_transfer import CHUNK_BYTES as FILE_CHUNK_BYTES
from sandboxd.snapshot_store import READ_CHUNK as SNAPSHOT_CHUNK_BYTES
from sandboxd.validation import MAX_ARGV_TOTAL_BYTES, MAX_PATH_BYTES

KiB = 1024


class Bound(enum.Enum):
    FIXED = "fixed"
    CUT = "cut"
    REFUSED = "refused"
    PAGED = "paged"
    CHUNKED = "chunked"
    EVENTS = "events"


@dataclass(frozen=True)
class ReplyBound:
    kind: Bound
    why: str
    items: str = ""  # PAGED: the reply's repeated field of entries
    per_message: int = 0  # CHUNKED/EVENTS: the most one message carries besides framing


def _fixed(why: str) -> ReplyBound:
    return ReplyBound(Bound.FIXED, why)


def _paged(items: str, why: str = "") -> ReplyBound:
    return ReplyBound(Bound.PAGED, why or "replies.fitted_page", items=items)


_SESSION = _fixed("one Session: 64 labels, 256 allowed commands and domains, 32 secret bindings")
_EMPTY = _fixed("an empty or counts-only message")
_FILE = _fixed(f"one FileInfo: paths of at most {MAX_PATH_BYTES} bytes")
_PROCESS = _fixed(f"one Process: argv of at most {MAX_ARGV_TOTAL_BYTES} bytes, a 4 KiB cwd")
# A volume's attachments: one per live session of its tenant that mounts it (at most one
# writer; readers up to tenant_max_sessions).
_VOLUME = _fixed("one Volume: 64 labels, an attachment per session that mounts it")
_OUTPUT = ReplyBound(
    Bound.CHUNKED, "output events cut at execution.CHUNK_BYTES", per_message=OUTPUT_CHUNK_BYTES
)

REPLY_BOUNDS: dict[str, ReplyBound] = {
    "sandboxd.v1.AdminService/GetServerInfo": _fixed("the server's version and settings"),
    "sandboxd.v1.AdminService/Sweep": _EMPTY,
    "sandboxd.v1.AdminService/PullImage": ReplyBound(
        Bound.EVENTS, "progress: the engine's status words, layer counts", per_message=4 * KiB
    ),
    "sandboxd.v1.AdminService/ListImages": _paged("images"),
    "sandboxd.v1.AuditService/ListAuditEvents": _paged("events"),
    "sandboxd.v1.FilesystemService/ReadFile": ReplyBound(
        Bound.REFUSED, "Files.read: a file over the room is refused unread, naming ReadFileStream"
    ),
    "sandboxd.v1.FilesystemService/WriteFile": _FILE,
    "sandboxd.v1.FilesystemService/ListDir": _paged(
        "entries", "fitted_page; whole: LISTING_TOO_LARGE"
    ),
    "sandboxd.v1.FilesystemService/Stat": _FILE,
    "sandboxd.v1.FilesystemService/Remove": _EMPTY,
    "sandboxd.v1.FilesystemService/MakeDir": _FILE,
    "sandboxd.v1.FilesystemService/ReadFileStream": ReplyBound(
        Bound.CHUNKED, "file_transfer.CHUNK_BYTES chunks", per_message=FILE_CHUNK_BYTES
    ),
    "sandboxd.v1.FilesystemService/WriteFileStream": _FILE,
    "sandboxd.v1.FilesystemService/Move": _FILE,
    "sandboxd.v1.FilesystemService/WatchDir": ReplyBound(
        Bound.EVENTS, "one FileEvent: two paths", per_message=2 * MAX_PATH_BYTES + KiB
    ),
    "sandboxd.v1.ProcessService/Exec": _OUTPUT,
    "sandboxd.v1.ProcessService/Run": ReplyBound(
        Bound.CUT, "replies.cut_to_fit: stdout, stderr and their text together"
    ),
    "sandboxd.v1.ProcessService/Interact": _OUTPUT,
    "sandboxd.v1.ProcessService/StartProcess": _PROCESS,
    "sandboxd.v1.ProcessService/AttachProcess": _OUTPUT,
    "sandboxd.v1.ProcessService/ListProcesses": _paged(
        "processes", "fitted_page; whole: REPLY_TOO_LARGE"
    ),
    "sandboxd.v1.ProcessService/SignalProcess": _EMPTY,
    "sandboxd.v1.ProcessService/GetProcess": _PROCESS,
    "sandboxd.v1.ProcessService/SendProcessInput": _EMPTY,
    "sandboxd.v1.ProcessService/CloseProcessStdin": _EMPTY,
    "sandboxd.v1.SessionService/CreateSession": _SESSION,
    "sandboxd.v1.SessionService/GetSession": _SESSION,
    "sandboxd.v1.SessionService/ListSessions": _paged("sessions"),
    "sandboxd.v1.SessionService/RenewLease": _SESSION,
    "sandboxd.v1.SessionService/DeleteSession": _EMPTY,
    "sandboxd.v1.SessionService/UpdateNetworkPolicy": _SESSION,
    "sandboxd.v1.SessionService/ListEgressEvents": _paged("events"),
    "sandboxd.v1.SessionService/SuspendSession": _SESSION,
    "sandboxd.v1.SessionService/ResumeSession": _SESSION,
    "sandboxd.v1.SessionService/WatchSession": ReplyBound(
        Bound.EVENTS, "one SessionEvent: the server's message and attributes", per_message=64 * KiB
    ),
    "sandboxd.v1.SessionService/WatchSessions": ReplyBound(
        Bound.EVENTS, "one SessionEvent: the server's message and attributes", per_message=64 * KiB
    ),
    "sandboxd.v1.SessionService/GetSessionStats": _fixed("counters"),
    "sandboxd.v1.SessionService/PublishPort": _fixed("one Preview: URLs and a token"),
    "sandboxd.v1.SessionService/UnpublishPort": _EMPTY,
    "sandboxd.v1.SessionService/ListPorts": _paged("previews"),
    "sandboxd.v1.SnapshotService/ExportArchive": ReplyBound(
        Bound.CHUNKED, "archive.transfer.CHUNK_BYTES chunks", per_message=ARCHIVE_CHUNK_BYTES
    ),
    "sandboxd.v1.SnapshotService/ImportArchive": _EMPTY,
    "sandboxd.v1.SnapshotService/CreateSnapshot": _fixed("one Snapshot: 64 labels"),
    "sandboxd.v1.SnapshotService/GetSnapshot": _fixed("one Snapshot: 64 labels"),
    "sandboxd.v1.SnapshotService/ListSnapshots": _paged("snapshots"),
    "sandboxd.v1.SnapshotService/DeleteSnapshot": _EMPTY,
    "sandboxd.v1.SnapshotService/DownloadSnapshot": ReplyBound(
        Bound.CHUNKED, "snapshot_store.READ_CHUNK chunks", per_message=SNAPSHOT_CHUNK_BYTES
    ),
    "sandboxd.v1.TemplateService/BuildTemplate": ReplyBound(
        Bound.EVENTS, "log lines cut at 1000 characters; then one Template", per_message=8 * KiB
    ),
    "sandboxd.v1.TemplateService/GetTemplate": _fixed("one Template"),
    "sandboxd.v1.TemplateService/ListTemplates": _paged("templates"),
    "sandboxd.v1.TemplateService/DeleteTemplate": _EMPTY,
    "sandboxd.v1.VolumeService/CreateVolume": _VOLUME,
    "sandboxd.v1.VolumeService/GetVolume": _VOLUME,
    "sandboxd.v1.VolumeService/ListVolumes": _paged("volumes"),
    "sandboxd.v1.VolumeService/DeleteVolume": _EMPTY,
    "sandboxd.v1.VolumeService/ExportVolume": ReplyBound(
        Bound.CHUNKED, "archive.transfer.CHUNK_BYTES chunks", per_message=ARCHIVE_CHUNK_BYTES
    ),
    "sandboxd.v1.VolumeService/ImportVolume": _VOLUME,
}
