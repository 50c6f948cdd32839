"""`python -m sandboxd` / `sandboxd`: load the configuration, then serve until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import sys

from sandboxd.config import load_config
from sandboxd.errors import ConfigError
from sandboxd.server import serve


def main() -> int:
    try:
        config = load_config()
    except ConfigError as exc:
        print(f"sandboxd: configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        asyncio.run(serve(config))
    except ConfigError as exc:
        print(f"sandboxd: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
