"""The served process's limit of open files, raised to what the system lets it have.

Every live session holds descriptors in the server for as long as it lives (its agent channel's
connection to the engine, and its streams), besides the gRPC port's connections
(`max_connections`), the preview listener's clients (`preview_max_clients`), the engine client's
pool and the store. A service manager's default soft limit is 1024 (systemd's, and most shells'),
so a server left at it fails with EMFILE at about 990 live sessions (one descriptor each, 21 idle:
docs/performance.md), sooner with busy listeners, while the hard limit (systemd: 524288) is the
system's real bound. The soft limit is the process's own to raise up to the hard one, as the Go
runtime does for every program: so the served process (`sandboxd.__main__`) raises it at start
and says when even the hard limit is low.
"""

from __future__ import annotations

import logging
import resource
from pathlib import Path

log = logging.getLogger("sandboxd.server")

# Below this, after raising, the server warns: a thousand live sessions and full listeners need
# about this many.
ENOUGH = 8192


def raise_open_files(nr_open: Path = Path("/proc/sys/fs/nr_open")) -> int:
    """Raise RLIMIT_NOFILE's soft limit to its hard one (an unlimited hard limit: to the
    kernel's per-process most, `fs.nr_open`); the soft limit in force after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            target = int(nr_open.read_text())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the open files limit from %d to %d: %s", soft, target, exc)
    if soft != resource.RLIM_INFINITY and soft < ENOUGH:
        log.warning(
            "the open files limit is %d: a server with many live sessions or busy listeners "
            "may run out of file descriptors (raise LimitNOFILE or `ulimit -Hn` to %d or more)",
            soft,
            ENOUGH,
        )
    return soft
