"""Tar transfer in and out of a session's workspace.

policy.py: the member rules (pure); pipe.py: the queues between the event loop and the import
thread; transfer.py: export and import, run through the in-sandbox helper.
"""

from sandboxd.archive.policy import ArchiveLimits, MemberChecker, normalize_member_name
from sandboxd.archive.transfer import ArchiveIO, ImportResult, check_and_forward

__all__ = [
    "ArchiveIO",
    "ArchiveLimits",
    "ImportResult",
    "MemberChecker",
    "check_and_forward",
    "normalize_member_name",
]
