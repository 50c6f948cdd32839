"""Tar transfer in and out of a session's workspace.

policy.py: the member rules (pure); check.py: the check loop over a stream; pipe.py: the
queues between the event loop and the import thread; transfer.py: export and import, run
through the in-sandbox helper.
"""

from sandboxd.archive.check import check_and_forward
from sandboxd.archive.policy import ArchiveLimits, MemberChecker, normalize_member_name
from sandboxd.archive.transfer import ArchiveIO, ImportResult

__all__ = [
    "ArchiveIO",
    "ArchiveLimits",
    "ImportResult",
    "MemberChecker",
    "check_and_forward",
    "normalize_member_name",
]
