"""The server's own disk full: a write to its data directory that found no space, told apart.

The server writes its state under `server.data_dir` (SQLite files: sessions, audit, leases,
snapshots, volumes; key files; snapshot files). When that file system is full, SQLite raises
`sqlite3.OperationalError("database or disk is full")` (SQLITE_FULL) and a file write raises
`OSError` ENOSPC (or EDQUOT, a quota). Neither is a bug: the caller gets RESOURCE_EXHAUSTED
with reason SERVER_DISK_FULL and a message naming the directory to free, not INTERNAL. Every
store writes one transaction per change and the operations around it undo what they did on a
failure, so nothing is half-done; and since each write is a fresh attempt (no state remembers
the failure), the first write after space returns succeeds, without a restart.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from sandboxd.errors import ResourceExhausted
from sandboxd.reasons import Reason

log = logging.getLogger(__name__)

_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_SQLITE_FULL = 13  # sqlite3.SQLITE_FULL, spelled out: older Pythons lack the constant


def _no_space(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
        return True
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and code & 0xFF == _SQLITE_FULL:
            return True
        return "database or disk is full" in str(exc)
    return False


def cause(exc: BaseException) -> BaseException | None:
    """The disk-full error `exc` is or was raised from (its cause or context chain), if any."""
    seen: set[int] = set()
    each: BaseException | None = exc
    while each is not None and id(each) not in seen:
        if _no_space(each):
            return each
        seen.add(id(each))
        each = each.__cause__ or each.__context__
    return None


class ServerDiskFull(ResourceExhausted):
    """A write of the server's own state found its data directory's file system full."""

    default_reason = Reason.SERVER_DISK_FULL

    def __init__(self) -> None:
        # No path: a caller is not told where the host keeps the server's state (the log
        # line `error_for` writes names it for the operator).
        super().__init__(
            "the server's disk is full: no space left to write its data directory, so this"
            " call's records could not be kept. The operator frees space there (old"
            " snapshots, the audit database); the next write succeeds without a restart"
        )


def error_for(exc: BaseException) -> ServerDiskFull | None:
    """The domain error for `exc` if a full disk is why it was raised, else None (logged: the
    operator's alert; the traceback stays in the log, not in the answer)."""
    full = cause(exc)
    if full is None:
        return None
    where = "the data directory (server.data_dir)"
    if isinstance(full, OSError) and full.filename:
        where = str(Path(str(full.filename)).parent)
    log.error("server disk full (%s): %s", where, full)
    return ServerDiskFull()


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Around a background loop's round (the reaper, the sweep, a checkpoint): a full disk
    raised inside becomes ServerDiskFull, a SandboxError the loop logs and survives. Raw, it
    escaped the loops' `except SandboxError`, and the server's task group stopped the server."""
    try:
        yield
    except Exception as exc:
        full = error_for(exc)
        if full is None:
            raise
        raise full from exc
