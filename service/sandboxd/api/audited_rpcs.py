"""Every RPC of the API, classified: read-only, or recorded in the audit log with these kinds.

A new RPC has to be put here (tests/unit/test_audited_rpcs.py walks the generated descriptors
and fails on one that is not), so a call that changes state cannot be left out of the audit
log by forgetting it. An audited RPC's record comes from the domain event type named here: the
code that did it emits the event (sandboxd.domain_events), the audit log's subscriber
(audit/subscriber.py) turns it into a record of the kind named. Nothing is read off a call's
messages. Any refused call, read-only or not, is also a `refused` record (the edge's
`CallRefused`).
"""

from __future__ import annotations

from typing import Final

READ_ONLY: Final = frozenset(
    {
        "SessionService/GetSession",
        "SessionService/ListSessions",
        "SessionService/ListEgressEvents",
        "SessionService/WatchSession",
        "SessionService/WatchSessions",
        "SessionService/GetSessionStats",
        "SessionService/ListPorts",
        "ProcessService/AttachProcess",
        "ProcessService/ListProcesses",
        "ProcessService/GetProcess",
        "FilesystemService/ReadFile",
        "FilesystemService/ListDir",
        "FilesystemService/Stat",
        "FilesystemService/ReadFileStream",
        "FilesystemService/WatchDir",
        "AdminService/GetServerInfo",
        "AdminService/ListImages",
        "SnapshotService/GetSnapshot",
        "SnapshotService/ListSnapshots",
        "SnapshotService/DownloadSnapshot",
        "AuditService/ListAuditEvents",
        "TemplateService/GetTemplate",
        "TemplateService/ListTemplates",
        "VolumeService/GetVolume",
        "VolumeService/ListVolumes",
    }
)

# Service/Method -> (the domain event its record comes from, the audit kind of that record)
AUDITED: Final[dict[str, tuple[str, str]]] = {
    "SessionService/CreateSession": ("SessionActed", "lifecycle"),
    "SessionService/RenewLease": ("SessionActed", "lifecycle"),
    "SessionService/DeleteSession": ("SessionActed", "lifecycle"),
    "SessionService/UpdateNetworkPolicy": ("SessionActed", "lifecycle"),
    "SessionService/SuspendSession": ("SessionActed", "lifecycle"),
    "SessionService/ResumeSession": ("SessionActed", "lifecycle"),
    "SessionService/PublishPort": ("PortPublished", "preview"),
    "SessionService/UnpublishPort": ("PortUnpublished", "preview"),
    "ProcessService/Exec": ("CommandExited", "command"),
    "ProcessService/Run": ("CommandExited", "command"),
    "ProcessService/Interact": ("CommandExited", "command"),
    "ProcessService/StartProcess": ("CommandStarted", "command"),
    "ProcessService/SignalProcess": ("ProcessSignalled", "lifecycle"),
    "ProcessService/SendProcessInput": ("ProcessInputSent", "lifecycle"),
    "ProcessService/CloseProcessStdin": ("ProcessInputSent", "lifecycle"),
    "FilesystemService/WriteFile": ("FileWritten", "file_write"),
    "FilesystemService/Remove": ("FileRemoved", "file_remove"),
    "FilesystemService/MakeDir": ("DirectoryMade", "file_write"),
    "FilesystemService/WriteFileStream": ("FileWritten", "file_write"),
    "FilesystemService/Move": ("FileMoved", "file_write"),
    "AdminService/Sweep": ("Swept", "lifecycle"),
    "AdminService/PullImage": ("ImagePulled", "lifecycle"),
    "SnapshotService/ExportArchive": ("ArchiveExported", "archive_export"),
    "SnapshotService/ImportArchive": ("ArchiveImported", "archive_import"),
    "SnapshotService/CreateSnapshot": ("SnapshotTaken", "snapshot"),
    "SnapshotService/DeleteSnapshot": ("SnapshotDeleted", "lifecycle"),
    "TemplateService/BuildTemplate": ("TemplateBuilt", "lifecycle"),
    "TemplateService/DeleteTemplate": ("TemplateDeleted", "lifecycle"),
    "VolumeService/CreateVolume": ("VolumeCreated", "lifecycle"),
    "VolumeService/DeleteVolume": ("VolumeDeleted", "lifecycle"),
    "VolumeService/ExportVolume": ("VolumeMoved", "archive_export"),
    "VolumeService/ImportVolume": ("VolumeMoved", "archive_import"),
}
