"""sandboxctl's session-making commands: create, run and `shell --new`, with the limit flags.

    sandboxctl create --memory 512Mi --command-timeout 60 --lease 3600
    sandboxctl run --rm --allow-all -- sh -c 'uname -a'     # like `docker run --rm`
    sandboxctl shell --new --template python                # like `docker run -it --rm ... sh`

`run` and `shell --new` create a session, use it, and (`run --rm`, always for `shell --new`)
delete it when done, also after ^C or an error; `run` without `--rm` keeps the session and
says its id on stderr.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd_client.cli_network import add_policy_options, policy_from
from sandboxd_client.cli_output import emit, pairs
from sandboxd_client.cli_shell import run_shell
from sandboxd_client.cli_volumes import volume_mounts

if TYPE_CHECKING:  # imported when a command runs: the parser needs none of them
    from sandboxd_client.client import SandboxClient
    from sandboxd_client.models import ResourceLimits
    from sandboxd_client.session import Session

_SIZE = re.compile(r"\A(\d+)\s*(|k|ki|kib|kb|m|mi|mib|mb|g|gi|gib|gb)\Z", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def size(text: str) -> int:
    """Bytes from `1048576`, `256Mi`, `512M`, `1GiB` (units are powers of 1024)."""
    found = _SIZE.match(text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 1048576, 256Mi, 1GiB)")
    return int(found.group(1)) * _UNITS[found.group(2)[:1].lower()]


def add_session_options(p: argparse.ArgumentParser, *, env: bool = True) -> None:
    """What a new session may be given: policy, image, identity, limits and lease."""
    p.add_argument("--id", help="caller-chosen session id (makes create idempotent)")
    p.add_argument("--allow", action="append", metavar="CMD", help="allow a command (repeat)")
    p.add_argument("--allow-all", action="store_true", help="allow every command")
    p.add_argument("--label", action="append", metavar="KEY=VALUE")
    if env:
        p.add_argument("--env", action="append", metavar="KEY=VALUE")
    p.add_argument("--file", action="append", metavar="REMOTE=LOCAL", help="declare a file")
    p.add_argument("--image")
    p.add_argument("--template", help="a template by name, e.g. python (instead of --image)")
    p.add_argument(
        "--volume",
        action="append",
        metavar="ID:PATH[:ro]",
        help="mount a volume of yours below /mnt (repeat)",
    )
    p.add_argument(
        "--isolation", choices=("runc", "gvisor"), help="isolation tier (default: the server's)"
    )
    p.add_argument(
        "--pull-policy",
        choices=("IF_NOT_PRESENT", "ALWAYS", "NEVER"),
        help="when to ask the registry for the image (default IF_NOT_PRESENT)",
    )
    p.add_argument("--user", help="numeric uid:gid")
    p.add_argument("--lease", type=float, metavar="SECONDS", help="lease (default the server's)")
    limits = p.add_argument_group("limits (default: the server's; at most its maximum)")
    limits.add_argument("--memory", type=size, metavar="SIZE", help="memory, e.g. 512Mi")
    limits.add_argument("--cpu-millis", type=int, metavar="N", help="CPU in thousandths of a core")
    limits.add_argument("--pids", type=int, metavar="N", help="most processes at once")
    limits.add_argument("--workspace-size", type=size, metavar="SIZE", help="/workspace size")
    limits.add_argument(
        "--file-size", type=size, metavar="SIZE", help="largest file moved through the API"
    )
    limits.add_argument(
        "--output-size", type=size, metavar="SIZE", help="output cap per stream of a command"
    )
    limits.add_argument(
        "--command-timeout", type=float, metavar="SECONDS", help="default command timeout"
    )
    p.add_argument("--json", action="store_true", help="same as -o json")
    add_policy_options(p)


def _limits(args: argparse.Namespace) -> ResourceLimits | None:
    from sandboxd_client.models import ResourceLimits

    given = ResourceLimits(
        memory_bytes=args.memory or 0,
        cpu_millis=args.cpu_millis or 0,
        pids=args.pids or 0,
        workspace_bytes=args.workspace_size or 0,
        file_bytes=args.file_size or 0,
        output_bytes=args.output_size or 0,
        command_timeout=args.command_timeout,
    )
    return None if given == ResourceLimits() else given


async def session_from_args(
    client: SandboxClient, args: argparse.Namespace, *, allow_all: bool = False
) -> Session:
    files = {}
    for spec in args.file or ():
        remote, sep, local = spec.partition("=")
        if not sep:
            raise SystemExit(f"sandboxctl: --file must be REMOTE=LOCAL, got {spec!r}")
        files[remote] = Path(local).read_bytes()
    return await client.create_session(
        session_id=args.id or "",
        allow=args.allow or (),
        allow_all=args.allow_all or (allow_all and not args.allow),
        files=files,
        image=args.image or "",
        limits=_limits(args),
        env=pairs(getattr(args, "env", None), "--env"),
        labels=pairs(args.label, "--label"),
        lease_ttl=args.lease,
        user=args.user or "",
        network=policy_from(args),
        from_snapshot_id=getattr(args, "snapshot", "") or "",
        isolation=args.isolation or "",
        template=args.template or "",
        pull_policy=args.pull_policy or "",
        volumes=volume_mounts(getattr(args, "volume", None)),
    )


async def cmd_create(client: SandboxClient, args: argparse.Namespace) -> int:
    session = await session_from_args(client, args)
    emit(args, session.info, session.id)
    return 0


async def cmd_run(client: SandboxClient, args: argparse.Namespace) -> int:
    from sandboxd_client.cli_processes import _argv, _follow

    argv = _argv(args, "sandboxctl run [--rm] [CREATE OPTIONS] -- CMD ...")
    session = await session_from_args(client, args)
    try:
        stdin = sys.stdin.buffer.read() if args.stdin else b""
        events = session.exec(argv, cwd=args.cwd or "", stdin=stdin, timeout=args.timeout)
        return await _follow(args, events)
    finally:
        if args.rm:
            await session.delete()
        else:
            print(
                f"sandboxctl: session {session.id} kept (sandboxctl rm {session.id})",
                file=sys.stderr,
            )


async def cmd_shell(client: SandboxClient, args: argparse.Namespace) -> int:
    argv = list(args.argv) or ["sh"]
    if args.new == (args.session is not None):
        raise SystemExit("sandboxctl: shell takes a SESSION, or --new to make one for itself")
    env = pairs(args.env, "--env")
    options = {"env": env, "timeout": args.timeout, "idle_timeout": args.idle_timeout}
    if not args.new:
        return await run_shell(client.session(args.session), argv, **options)
    session = await session_from_args(client, args, allow_all=True)
    try:
        return await run_shell(session, argv, **options)
    finally:
        await session.delete()
