"""`python -m sandboxd` / `sandboxd`: load the configuration, then serve until SIGTERM."""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys

from sandboxd.config import load_config
from sandboxd.errors import ConfigError
from sandboxd.logging_setup import configure_logging
from sandboxd.server import serve


def _tune_malloc() -> None:
    """Keep the 64-256 KiB buffers of streamed messages on the heap (glibc).

    glibc serves blocks over its mmap threshold (128 KiB, then adjusted as blocks are freed)
    with a fresh mmap each time, so every archive or output chunk page-faulted its memory
    in anew: some 12 000 faults and a quarter of the server's CPU per 48 MiB export. Blocks
    under 1 MiB now come from the heap, which keeps up to 4 MiB free before giving memory
    back. Settings given in the environment (MALLOC_*_) are left alone; elsewhere a no-op.
    """
    if not sys.platform.startswith("linux") or any(
        k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    ):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 1024 * 1024)
    mallopt(m_trim_threshold, 4 * 1024 * 1024)


def main() -> int:
    _tune_malloc()
    try:
        config = load_config()
    except ConfigError as exc:
        print(f"sandboxd: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.server.log_level, config.server.log_format)
    try:
        asyncio.run(serve(config))
    except ConfigError as exc:
        print(f"sandboxd: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
