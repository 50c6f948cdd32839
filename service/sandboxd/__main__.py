"""`python -m sandboxd` / `sandboxd`: load the configuration, then serve until SIGTERM."""

from __future__ import annotations

import asyncio
import sys

from sandboxd.config import load_config
from sandboxd.errors import ConfigError
from sandboxd.heap import tune_malloc
from sandboxd.logging_setup import configure_logging
from sandboxd.server import serve


def main() -> int:
    tune_malloc()
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
