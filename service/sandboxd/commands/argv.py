"""The one place a sandbox command becomes a command line (the helper's, helper/sbx.c), and
the environment each kind runs with.

Internal runs (helper subcommands, tools, dials) never see the session's environment: a
caller's `PATH` must not choose which `tar` the server runs, and loader variables
(`LD_PRELOAD`...) must not load code into it. Every exec starts from the sandbox's environment
(the session's env) and can only override variables, not remove them; so an internal run
overrides the dangerous ones, and a tool run under `sbx run --clean-env` starts with a fixed,
complete environment (PATH, HOME, LANG) that the supervisor builds itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from sandboxd.commands.types import (
    Dial,
    HelperCall,
    Packed,
    Plain,
    SandboxCommand,
    Supervised,
    ToolRun,
    Unpacked,
)
from sandboxd.profile import DEFAULT_PATH, HELPER_IN_CONTAINER

# Overrides of the container's (session's) environment for every internal exec. Variables that
# change what a static `sbx` does: none; what the dynamic tools it starts load or find: these.
LOADER_VARIABLES = (
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "LD_DEBUG",
    "LD_DEBUG_OUTPUT",
    "LD_PROFILE",
    "LD_BIND_NOW",
    "LD_DYNAMIC_WEAK",
    "LD_ASSUME_KERNEL",
    "GCONV_PATH",
    "MALLOC_TRACE",
    "LOCPATH",
    "NLSPATH",
)
INTERNAL_ENV: dict[str, str] = {
    "PATH": DEFAULT_PATH,
    "HOME": "/workspace",
    "LANG": "C.UTF-8",
    **{name: "" for name in LOADER_VARIABLES},
}


def argv_of(command: SandboxCommand) -> list[str]:
    """The command line that runs `command` in the sandbox."""
    match command:
        case HelperCall(args):
            return [HELPER_IN_CONTAINER, *args]
        case ToolRun(cwd, argv, through):
            run = [HELPER_IN_CONTAINER, "run", "--clean-env", "--cwd", cwd, "--"]
            return [*run, *_through(through), *argv]
        case Dial(port):
            return [HELPER_IN_CONTAINER, "dial", str(port)]
        case Plain(argv):
            return list(argv)
        case Supervised():
            pty = command.pty
            return [
                HELPER_IN_CONTAINER,
                "run",
                "--id",
                command.token,
                "--timeout-ms",
                str(command.timeout_ms),
                "--cwd",
                command.cwd,
                *(["--tty", f"{pty[0]}x{pty[1]}"] if pty is not None else []),
                "--",
                *command.argv,
            ]


def _through(through: Packed | Unpacked | None) -> list[str]:
    """The helper's compression in front of a tool (helper/zstd.c), which then runs it."""
    match through:
        case Packed(level, cap):
            return [HELPER_IN_CONTAINER, "zpack", str(level), str(cap), "--"]
        case Unpacked():
            return [HELPER_IN_CONTAINER, "zunpack", "--"]
        case None:
            return []


def env_of(command: SandboxCommand) -> Mapping[str, str] | None:
    """What the command's environment overrides of the sandbox's (None: nothing)."""
    match command:
        case Supervised():
            return command.env
        case Plain():
            return None
        case _:
            return INTERNAL_ENV
