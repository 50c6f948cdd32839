"""End the `runsc-gofer`/`runsc-sandbox` processes a gVisor container left behind.

A runsc container that fails to start (a refused setting, a Sentry that crashed on boot) can
leave its gofer and sandbox processes running on the host, outside any container the engine
still knows. They are found by their command line: runsc re-executes itself with argv[0]
`runsc-gofer` or `runsc-sandbox` (the kernel's `comm` stays `exe`), and every one of them names
the container's bundle directory, which ends in the 64-hex container id. Only a local engine's
processes are on this host, so the Docker adapter calls this only for a unix-socket engine.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from pathlib import Path

log = logging.getLogger(__name__)

_NAMES = (b"runsc-gofer", b"runsc-sandbox")
# A runsc container restored from a checkpoint and checkpointed again keeps its containerd shim
# (`containerd-shim-runc-v2 ... -id <container id>`) after its removal, one per memory suspend
# from the second on: ended with the runsc processes once the container is gone.
AFTER_CHECKPOINT = (*_NAMES, b"containerd-shim-runc-v2")
_ID_RE = re.compile(r"\A[0-9a-f]{64}\Z")


def find_leftovers(
    container_id: str, proc: Path = Path("/proc"), names: tuple[bytes, ...] = _NAMES
) -> list[int]:
    """Pids of runsc processes of that container (a full 64-hex id; anything else finds none,
    so a short or forged id can never match another container's processes)."""
    if not _ID_RE.match(container_id):
        return []
    needle = container_id.encode()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if argv and os.path.basename(argv[0]) in names and any(needle in a for a in argv[1:]):
            found.append(int(entry.name))
    return sorted(found)


def end_leftovers(
    container_id: str, proc: Path = Path("/proc"), names: tuple[bytes, ...] = _NAMES
) -> list[int]:
    """SIGKILL them; returns the pids signalled. Blocking (reads /proc): run it in a thread.
    Only for a container that is gone or never ran (a live one's processes are its own)."""
    ended = []
    for pid in find_leftovers(container_id, proc, names):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        except PermissionError:
            log.warning("runsc process %d of container %s: not ours to end", pid, container_id[:12])
            continue
        ended.append(pid)
    if ended:
        log.warning(
            "ended %d runsc process(es) left by container %s: %s",
            len(ended),
            container_id[:12],
            ", ".join(map(str, ended)),
        )
    return ended
