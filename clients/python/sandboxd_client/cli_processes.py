"""sandboxctl's process commands: exec, shell, start, ps, attach, kill."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from sandboxd_client.cli_output import emit, pairs, table, wants_json, when
from sandboxd_client.cli_shell import exit_status, run_shell

if TYPE_CHECKING:  # imported when a command runs: the parser needs none of them
    from sandboxd_client.client import SandboxClient
    from sandboxd_client.events import Event

EXIT_ERROR = 125  # the stream ended with no exit status: a failure of ours, not the command's


def _argv(args: argparse.Namespace, usage: str) -> list[str]:
    argv = list(args.argv)
    if not argv:
        raise SystemExit(f"sandboxctl: a command is needed: {usage}")
    return argv


async def _follow(args: argparse.Namespace, events: AsyncIterator[Event]) -> int:
    """Write output as it arrives (or JSON lines); the exit code of the Exited event."""
    from sandboxd_client._convert import as_dict
    from sandboxd_client.events import Exited, Output, OutputGap, Started

    out, err = sys.stdout.buffer, sys.stderr.buffer
    exit_code = EXIT_ERROR
    async for event in events:
        if wants_json(args):
            print(json.dumps(as_dict(event), sort_keys=True), flush=True)
        elif isinstance(event, Output):
            target = err if event.stream == "stderr" else out
            target.write(event.data)
            target.flush()  # live: a line shows as soon as the command prints it
        elif isinstance(event, OutputGap):
            print(f"sandboxctl: {event.length} bytes of {event.stream} lost", file=sys.stderr)
        elif isinstance(event, Started) and getattr(args, "verbose", False):
            print(f"sandboxctl: started {event.process_id}", file=sys.stderr)
        if isinstance(event, Exited):
            exit_code = exit_status(event)
            if not wants_json(args):
                if event.timed_out:
                    print("sandboxctl: command timed out", file=sys.stderr)
                if event.truncated:
                    print("sandboxctl: output over the cap; command killed", file=sys.stderr)
    return exit_code


async def cmd_exec(client: SandboxClient, args: argparse.Namespace) -> int:
    argv = _argv(args, "sandboxctl exec SESSION -- CMD ...")
    stdin = sys.stdin.buffer.read() if args.stdin else b""
    session = client.session(args.session)
    events = session.exec(
        argv, cwd=args.cwd or "", env=pairs(args.env, "--env"), stdin=stdin, timeout=args.timeout
    )
    return await _follow(args, events)


async def cmd_shell(client: SandboxClient, args: argparse.Namespace) -> int:
    argv = list(args.argv) or ["sh"]
    return await run_shell(client.session(args.session), argv, env=pairs(args.env, "--env"))


async def cmd_start(client: SandboxClient, args: argparse.Namespace) -> int:
    argv = _argv(args, "sandboxctl start SESSION [--id ID] -- CMD ...")
    proc = await client.session(args.session).start_process(
        argv,
        process_id=args.id or "",
        cwd=args.cwd or "",
        env=pairs(args.env, "--env"),
        timeout=args.timeout,
    )
    emit(args, proc, proc.process_id)
    return 0


async def cmd_ps(client: SandboxClient, args: argparse.Namespace) -> int:
    procs = [p async for p in client.session(args.session).processes()]

    def text() -> str:
        rows = [("PROCESS", "STATE", "EXIT", "STARTED", "STDOUT", "STDERR", "COMMAND")]
        for p in procs:
            code = "-" if p.exited is None else (p.exited.signal or str(p.exited.exit_code))
            rows.append(
                (
                    p.process_id,
                    p.state,
                    code,
                    when(p.started_at),
                    str(p.stdout_bytes),
                    str(p.stderr_bytes),
                    " ".join(p.argv),
                )
            )
        return table(rows)

    emit(args, procs, text)
    return 0


async def cmd_attach(client: SandboxClient, args: argparse.Namespace) -> int:
    session = client.session(args.session)
    events = session.attach(
        args.process, stdout_offset=args.stdout_offset, stderr_offset=args.stderr_offset
    )
    return await _follow(args, events)


async def cmd_kill(client: SandboxClient, args: argparse.Namespace) -> int:
    await client.session(args.session).signal_process(args.process, args.signal)
    emit(args, {"process_id": args.process, "signal": args.signal}, "")
    return 0


# ---- files -------------------------------------------------------------------------------------
