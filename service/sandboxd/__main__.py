"""`sandboxd`: serve until SIGTERM, check a configuration, or tell the version.

    sandboxd [serve] [--config FILE] [--SETTING VALUE ...]   serve (the word `serve` is optional)
    sandboxd check-config [--config FILE] [--SETTING ...]     every problem, exit 1 if any
    sandboxd --version

`check-config` loads exactly what `serve` would (flags, `SANDBOXD_*`, the file, defaults) and
lists every problem with the setting's name and where its value came from, instead of stopping
at the first, so an operator fixes a file in one pass. It reaches no engine.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from sandboxd import __version__, gc_tuning
from sandboxd.config import check_config, load_config
from sandboxd.errors import ConfigError
from sandboxd.heap import tune_malloc
from sandboxd.logging_setup import configure_logging
from sandboxd.open_files import raise_open_files
from sandboxd.server import serve

USAGE_EXIT = 2


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--version"]:
        print(f"sandboxd {__version__}")
        return 0
    if args[:1] == ["check-config"]:
        return _check(args[1:])
    if args[:1] == ["serve"]:
        args = args[1:]
    return _serve(args)


def _check(args: list[str]) -> int:
    found = check_config(args)
    for problem in found:
        print(f"sandboxd: {problem}", file=sys.stderr)
    if found:
        print(f"sandboxd: {len(found)} problem(s) in the configuration", file=sys.stderr)
        return 1
    print("sandboxd: configuration OK")
    return 0


def _serve(args: list[str]) -> int:
    tune_malloc()
    try:
        config = load_config(args)
    except ConfigError as exc:
        print(f"sandboxd: configuration error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    configure_logging(config.server.log_level, config.server.log_format)
    raise_open_files()
    gc_tuning.tune()
    try:
        asyncio.run(serve(config, ready=lambda _port: gc_tuning.freeze_start_up()))
    except ConfigError as exc:
        print(f"sandboxd: {exc}", file=sys.stderr)
        return USAGE_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
