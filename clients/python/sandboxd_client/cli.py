"""sandboxctl: sandboxd from a terminal.

    sandboxctl create --allow sh --label owner=me     # prints the session id
    sandboxctl exec SESSION -- sh -c 'echo hi'        # live output; exits with the remote code
    sandboxctl shell SESSION                          # an interactive terminal (PTY)
    sandboxctl cp ./src SESSION:                      # tar upload (as src/), progress bar
    sandboxctl cp SESSION:out ./out                   # tar download
    sandboxctl start SESSION --id web -- sh -c '...'  # a background process
    sandboxctl ps SESSION / attach SESSION web / kill SESSION web
    sandboxctl snapshot create SESSION / snapshot ls / fork SNAPSHOT
    sandboxctl ls --label owner=me / info [SESSION] / rm SESSION...

The server is `--addr` or $SANDBOXD_ADDR (default 127.0.0.1:50051); a bearer token is
`--token` or $SANDBOXD_TOKEN. `-o json` prints every result as JSON (streams as one JSON
object per line). A failed call prints the server's reason and exits 1; `exec`, `attach` and
`shell` otherwise exit with the remote command's exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from sandboxd_client.cli_audit import add_audit_options, add_watch_options, cmd_audit, cmd_watch
from sandboxd_client.cli_completion import completion_script
from sandboxd_client.cli_files import cmd_cp
from sandboxd_client.cli_images import add_image_commands
from sandboxd_client.cli_network import add_policy_options, cmd_egress, cmd_network
from sandboxd_client.cli_output import emit, pairs, table, wants_json, when
from sandboxd_client.cli_previews import add_preview_commands
from sandboxd_client.cli_processes import (
    cmd_attach,
    cmd_exec,
    cmd_kill,
    cmd_ps,
    cmd_start,
)
from sandboxd_client.cli_run import add_session_options, cmd_create, cmd_run, cmd_shell
from sandboxd_client.cli_snapshots import (
    cmd_snapshot_create,
    cmd_snapshot_download,
    cmd_snapshot_get,
    cmd_snapshot_ls,
    cmd_snapshot_rm,
)
from sandboxd_client.cli_templates import add_template_commands
from sandboxd_client.cli_volumes import add_volume_commands

if TYPE_CHECKING:  # imported once the command line is parsed (none for --version, completion)
    from sandboxd_client.client import SandboxClient

# sandboxctl's own failures (a refused call, no server, a bad flag) exit 125, as docker's do, so
# that they never read as the remote command's exit code (exec, run, shell and attach pass that
# on: 0-124, 126-255, 128+N for a signal).
EXIT_ERROR = 125


async def cmd_ls(client: SandboxClient, args: argparse.Namespace) -> int:
    sessions = [s async for s in client.list_sessions(pairs(args.label, "--label"))]

    def text() -> str:
        rows = [("SESSION", "STATE", "IMAGE", "LEASE EXPIRES", "LABELS")]
        for s in sessions:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            rows.append((s.id, s.state, s.info.image, when(s.lease_expires_at), labels))
        return table(rows)

    emit(args, [s.info for s in sessions], text)
    return 0


async def cmd_info(client: SandboxClient, args: argparse.Namespace) -> int:
    from sandboxd_client.models import as_dict

    value: Any = (
        (await client.get_session(args.session)).info
        if args.session
        else await client.server_info()
    )
    print(json.dumps(as_dict(value), indent=2, sort_keys=True))  # JSON is its text form too
    return 0


async def cmd_rm(client: SandboxClient, args: argparse.Namespace) -> int:
    for sid in args.sessions:
        await client.session(sid).delete()
    emit(args, {"deleted": list(args.sessions)}, "\n".join(args.sessions))
    return 0


async def cmd_renew(client: SandboxClient, args: argparse.Namespace) -> int:
    session = await client.session(args.session).renew(args.ttl)
    emit(args, session.info, lambda: when(session.lease_expires_at))
    return 0


async def cmd_suspend(client: SandboxClient, args: argparse.Namespace) -> int:
    session = await client.session(args.session).suspend()
    emit(args, session.info, session.state)
    return 0


async def cmd_resume(client: SandboxClient, args: argparse.Namespace) -> int:
    session = await client.session(args.session).resume()
    emit(args, session.info, session.state)
    return 0


async def cmd_sweep(client: SandboxClient, args: argparse.Namespace) -> int:
    from sandboxd_client.models import as_dict

    result = await client.sweep()
    emit(args, result, lambda: " ".join(f"{k}={v}" for k, v in as_dict(result).items()))
    return 0


# ---- processes ---------------------------------------------------------------------------------


async def cmd_completion(client: SandboxClient | None, args: argparse.Namespace) -> int:
    print(completion_script(build_parser(), args.shell))
    return 0


# ---- main --------------------------------------------------------------------------------------


def _command_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cwd")
    p.add_argument("--env", action="append", metavar="KEY=VALUE")
    p.add_argument("-t", "--timeout", type=float, metavar="SECONDS", help="command timeout")


class _Unbuilt:
    """A command's parser left empty: each add_argument is argparse's costliest step (a help
    formatter, a gettext lookup), so a start-up builds only the command it runs."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._parser = parser

    def set_defaults(self, **kw: Any) -> None:
        self._parser.set_defaults(**kw)

    def add_argument(self, *args: Any, **kw: Any) -> None:
        pass

    def add_argument_group(self, *args: Any, **kw: Any) -> _Unbuilt:
        return self

    def add_mutually_exclusive_group(self, **kw: Any) -> _Unbuilt:
        return self

    def add_subparsers(self, **kw: Any) -> _Commands:
        return _Commands(None, only="")


class _Commands:
    """The subcommands, each parser built in full only when `only` is None or its name."""

    def __init__(self, sub: Any, only: str | None) -> None:
        self._sub, self._only = sub, only
        self.built = False

    def add_parser(self, name: str, **kw: Any) -> Any:
        if self._only is None or self._only == name:
            self.built = True
            return self._sub.add_parser(name, **kw)
        return _Unbuilt(argparse.ArgumentParser(add_help=False))


# The top-level options that take a value: a command's name is the first other word.
_VALUED = ("--addr", "--token", "--ca", "--call-timeout", "--output")


def _command_word(argv: Sequence[str]) -> str | None:
    """The command `argv` runs (None with no command, or with a top-level -h)."""
    words = iter(argv)
    for word in words:
        if word in ("-h", "--help"):
            return None
        if word == "-o" or (
            word.startswith("--") and "=" not in word and any(v.startswith(word) for v in _VALUED)
        ):
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


class _Retry(Exception):
    """A partly built parser refused the command line: the full one says why."""


class _QuietParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Retry(message)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """sandboxctl's parser: every command, or (`only`) every option of one command alone
    (`only=""`: none, for --version)."""
    cls = _Parser if only is None else _QuietParser
    parser = cls(prog="sandboxctl", description="Run commands in sandboxd sessions.")
    parser.add_argument("--version", action="version", version=f"sandboxctl {_version()}")
    parser.add_argument(
        "--addr",
        default=os.environ.get("SANDBOXD_ADDR", "127.0.0.1:50051"),
        help="server host:port (default $SANDBOXD_ADDR or 127.0.0.1:50051)",
    )
    parser.add_argument(
        "--token", default=os.environ.get("SANDBOXD_TOKEN") or None, help="($SANDBOXD_TOKEN)"
    )
    parser.add_argument("--tls", action="store_true", help="use TLS with the system roots")
    parser.add_argument("--ca", type=Path, help="PEM file of the CA to trust (implies --tls)")
    parser.add_argument(
        "--call-timeout", type=float, metavar="SECONDS", help="deadline of each unary call"
    )
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    sub = _Commands(parser.add_subparsers(dest="command", required=True), only)

    def add(name: str, func: Callable[..., Any], help: str, **kw: Any) -> Any:
        """The command's parser (an `_Unbuilt` stand-in for a command not being run)."""
        p = sub.add_parser(name, help=help, **kw)
        p.set_defaults(func=func)
        return p

    add_session_options(add("create", cmd_create, "create a session and print its id"))
    p = add("fork", cmd_create, "create a session from a snapshot")
    p.add_argument("snapshot")
    add_session_options(p)
    p = add("ls", cmd_ls, "list sessions")
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help="filter (repeat)")
    p.add_argument("--json", action="store_true", help="same as -o json")
    p = add("info", cmd_info, "server information, or one session's (JSON)")
    p.add_argument("session", nargs="?")
    p = add("rm", cmd_rm, "delete sessions")
    p.add_argument("sessions", nargs="+")
    p = add("renew", cmd_renew, "extend a session's lease")
    p.add_argument("session")
    p.add_argument("--ttl", type=float, metavar="SECONDS")
    add("suspend", cmd_suspend, "snapshot and stop a session").add_argument("session")
    add("resume", cmd_resume, "bring a suspended session back").add_argument("session")
    add("sweep", cmd_sweep, "expire ended leases, remove orphans (admin)")
    p = add("network", cmd_network, "set a session's egress policy (no --domain: DENY)")
    p.add_argument("session")
    add_policy_options(p)
    add("egress", cmd_egress, "a session's egress log").add_argument("session")

    p = add("exec", cmd_exec, "run a command, streaming its output: exec SESSION -- CMD ...")
    p.add_argument("session")
    _command_options(p)
    p.add_argument("-i", "--stdin", action="store_true", help="send local stdin to the command")
    p.add_argument("-v", "--verbose", action="store_true")
    p = add(
        "run",
        cmd_run,
        "create a session, run a command in it: run [--rm] [CREATE OPTIONS] -- CMD ...",
    )
    p.add_argument("--rm", action="store_true", help="delete the session when the command ends")
    p.add_argument("--cwd")
    p.add_argument("-t", "--timeout", type=float, metavar="SECONDS", help="command timeout")
    p.add_argument("-i", "--stdin", action="store_true", help="send local stdin to the command")
    add_session_options(p)
    p = add(
        "shell",
        cmd_shell,
        "an interactive terminal: shell SESSION [-- CMD ...] (sh), or shell --new [CREATE OPTIONS]",
    )
    p.add_argument("session", nargs="?")
    p.add_argument(
        "--new", action="store_true", help="in a new session, deleted when the shell exits"
    )
    p.add_argument(
        "-t", "--timeout", type=float, metavar="SECONDS", help="end the shell after this long"
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        metavar="SECONDS",
        help="end it after this long with no typing and no output (default the server's, 30m)",
    )
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="for the shell")
    add_session_options(p, env=False)
    p = add("start", cmd_start, "start a background process: start SESSION -- CMD ...")
    p.add_argument("session")
    p.add_argument("--id", help="caller-chosen process id")
    _command_options(p)
    add("ps", cmd_ps, "list a session's background processes").add_argument("session")
    p = add("attach", cmd_attach, "replay a background process's output, then follow it")
    p.add_argument("session")
    p.add_argument("process")
    p.add_argument("--stdout-offset", type=int, default=0, metavar="BYTES")
    p.add_argument("--stderr-offset", type=int, default=0, metavar="BYTES")
    p = add("kill", cmd_kill, "signal a background process")
    p.add_argument("session")
    p.add_argument("process")
    p.add_argument("-s", "--signal", default="SIGTERM")

    p = add(
        "cp",
        cmd_cp,
        "copy in or out via tar (SESSION:path)",
        description="LOCAL SESSION:DIR puts LOCAL (a file or folder) into DIR under its own "
        "name; SESSION:DIR LOCAL copies the folder DIR (empty: the workspace) to LOCAL, or "
        "into it under DIR's name when LOCAL is an existing folder.",
    )
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--progress", action="store_true", default=None, help="always show progress")
    p.add_argument("--no-progress", action="store_false", dest="progress")

    add_image_commands(sub)
    add_template_commands(sub)
    add_volume_commands(sub)
    add_preview_commands(sub)
    snap = sub.add_parser("snapshot", help="snapshots: create, ls, get, rm, download")
    ssub = snap.add_subparsers(dest="snapshot_command", required=True)
    p = ssub.add_parser("create", help="snapshot a session, print the snapshot id")
    p.set_defaults(func=cmd_snapshot_create)
    p.add_argument("session")
    p.add_argument("--kind", choices=("TAR", "IMAGE"))
    p.add_argument("--label", action="append", metavar="KEY=VALUE")
    p = ssub.add_parser("ls", help="list snapshots (of one session)")
    p.set_defaults(func=cmd_snapshot_ls)
    p.add_argument("session", nargs="?")
    p = ssub.add_parser("get", help="one snapshot")
    p.set_defaults(func=cmd_snapshot_get)
    p.add_argument("snapshot")
    p = ssub.add_parser("rm", help="delete snapshots")
    p.set_defaults(func=cmd_snapshot_rm)
    p.add_argument("snapshots", nargs="+")
    p = ssub.add_parser("download", help="save a snapshot's tar")
    p.set_defaults(func=cmd_snapshot_download)
    p.add_argument("snapshot")
    p.add_argument("file")

    add_audit_options(add("audit", cmd_audit, "the audit log: who ran what, when (filters)"))
    add_watch_options(
        add(
            "watch", cmd_watch, "live session events, or a folder's changes: watch [SESSION [PATH]]"
        )
    )

    p = add("completion", cmd_completion, "print a shell completion script")
    p.add_argument("shell", choices=("bash", "zsh", "fish"))
    if not sub.built and only != "":  # "": --version, which needs no command
        raise _Retry(f"no command {only!r}")
    return parser


class _Parser(argparse.ArgumentParser):
    """A usage error is one of sandboxctl's own failures: exit 125, not argparse's 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def _version() -> str:
    from sandboxd_client import __version__

    return __version__


async def _main(args: argparse.Namespace) -> int:
    func: Callable[..., Any] = args.func
    from sandboxd_client.client import TLS, SandboxClient

    tls = None
    if args.tls or args.ca:
        tls = TLS(root_certificates=args.ca.read_bytes() if args.ca else None)
    timeout = args.call_timeout
    async with SandboxClient(args.addr, token=args.token, tls=tls, timeout=timeout) as c:
        result: int = await func(c, args)
        return result


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Options, then the remote command after the first `--` (kept verbatim, dashes and all)."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    head = argv[:split]
    command = _command_word(head)
    if command is None and "--version" in head:
        command = ""
    try:
        # The command's own parser alone: building all ~50 is most of a start-up's time.
        args = build_parser(command).parse_args(head)
    except _Retry:  # not a command, or a mistake: every command's parser reports it
        args = build_parser().parse_args(head)
    args.argv = argv[split + 1 :]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.func is cmd_completion:  # calls no server: no grpc
        print(completion_script(build_parser(), args.shell))
        return 0
    from sandboxd_client.errors import SandboxError  # grpc: once a command will call the server

    try:
        return asyncio.run(_main(args))
    except BrokenPipeError:
        # `sandboxctl ... | head`: the reader left. Say nothing (Python would print a traceback
        # at exit flushing stdout again); 141 is what a shell reports for SIGPIPE.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13
    except SystemExit as stop:
        if isinstance(stop.code, str):  # a message of sandboxctl's own (a bad --file, ...)
            print(stop.code, file=sys.stderr)
            return EXIT_ERROR
        raise
    except SandboxError as err:
        if wants_json(args):
            error = {"reason": err.reason, "message": err.message, "code": err.code.name}
            print(json.dumps({"error": error | {"metadata": err.metadata}}), file=sys.stderr)
        else:
            print(f"sandboxctl: {err.reason}: {err.message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
