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
import io
import json
import os
import sys
import tarfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from sandboxd_client.cli_completion import completion_script
from sandboxd_client.cli_progress import Progress
from sandboxd_client.cli_shell import exit_status, run_shell
from sandboxd_client.client import TLS, SandboxClient
from sandboxd_client.errors import SandboxError
from sandboxd_client.models import Event, Exited, Output, OutputGap, Started, as_dict
from sandboxd_client.session import Session

EXIT_ERROR = 1
_CHUNK = 256 * 1024


def _pairs(values: Sequence[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"sandboxctl: {what} must be KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _json(args: argparse.Namespace) -> bool:
    return bool(args.output == "json" or getattr(args, "json", False))


def _emit(args: argparse.Namespace, value: Any, text: Callable[[], str] | str) -> None:
    """One result: JSON with `-o json`, else the command's own text form."""
    if _json(args):
        print(json.dumps(as_dict(value), indent=2, sort_keys=True))
    else:
        out = text() if callable(text) else text
        if out:
            print(out)


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value is not None else "-"


# ---- sessions ----------------------------------------------------------------------------------


async def cmd_create(client: SandboxClient, args: argparse.Namespace) -> int:
    files = {}
    for spec in args.file or ():
        remote, sep, local = spec.partition("=")
        if not sep:
            raise SystemExit(f"sandboxctl: --file must be REMOTE=LOCAL, got {spec!r}")
        files[remote] = Path(local).read_bytes()
    session = await client.create_session(
        session_id=args.id or "",
        allow=args.allow or (),
        allow_all=args.allow_all,
        files=files,
        image=args.image or "",
        env=_pairs(args.env, "--env"),
        labels=_pairs(args.label, "--label"),
        lease_ttl=args.lease,
        user=args.user or "",
        from_snapshot_id=getattr(args, "snapshot", "") or "",
    )
    _emit(args, session.info, session.id)
    return 0


async def cmd_ls(client: SandboxClient, args: argparse.Namespace) -> int:
    sessions = [s async for s in client.list_sessions(_pairs(args.label, "--label"))]

    def text() -> str:
        rows = [("SESSION", "STATE", "IMAGE", "LEASE EXPIRES", "LABELS")]
        for s in sessions:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            rows.append((s.id, s.state, s.info.image, _when(s.lease_expires_at), labels))
        return _table(rows)

    _emit(args, [s.info for s in sessions], text)
    return 0


async def cmd_info(client: SandboxClient, args: argparse.Namespace) -> int:
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
    _emit(args, {"deleted": list(args.sessions)}, "\n".join(args.sessions))
    return 0


async def cmd_renew(client: SandboxClient, args: argparse.Namespace) -> int:
    session = await client.session(args.session).renew(args.ttl)
    _emit(args, session.info, lambda: _when(session.lease_expires_at))
    return 0


async def cmd_suspend(client: SandboxClient, args: argparse.Namespace) -> int:
    session = await client.session(args.session).suspend()
    _emit(args, session.info, session.state)
    return 0


async def cmd_resume(client: SandboxClient, args: argparse.Namespace) -> int:
    session = await client.session(args.session).resume()
    _emit(args, session.info, session.state)
    return 0


async def cmd_sweep(client: SandboxClient, args: argparse.Namespace) -> int:
    result = await client.sweep()
    _emit(args, result, lambda: " ".join(f"{k}={v}" for k, v in as_dict(result).items()))
    return 0


# ---- processes ---------------------------------------------------------------------------------


def _argv(args: argparse.Namespace, usage: str) -> list[str]:
    argv = list(args.argv)
    if not argv:
        raise SystemExit(f"sandboxctl: a command is needed: {usage}")
    return argv


async def _follow(args: argparse.Namespace, events: AsyncIterator[Event]) -> int:
    """Write output as it arrives (or JSON lines); the exit code of the Exited event."""
    out, err = sys.stdout.buffer, sys.stderr.buffer
    exit_code = EXIT_ERROR
    async for event in events:
        if _json(args):
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
            if not _json(args):
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
        argv, cwd=args.cwd or "", env=_pairs(args.env, "--env"), stdin=stdin, timeout=args.timeout
    )
    return await _follow(args, events)


async def cmd_shell(client: SandboxClient, args: argparse.Namespace) -> int:
    argv = list(args.argv) or ["sh"]
    return await run_shell(client.session(args.session), argv, env=_pairs(args.env, "--env"))


async def cmd_start(client: SandboxClient, args: argparse.Namespace) -> int:
    argv = _argv(args, "sandboxctl start SESSION [--id ID] -- CMD ...")
    proc = await client.session(args.session).start_process(
        argv,
        process_id=args.id or "",
        cwd=args.cwd or "",
        env=_pairs(args.env, "--env"),
        timeout=args.timeout,
    )
    _emit(args, proc, proc.process_id)
    return 0


async def cmd_ps(client: SandboxClient, args: argparse.Namespace) -> int:
    procs = await client.session(args.session).processes()

    def text() -> str:
        rows = [("PROCESS", "STATE", "EXIT", "STARTED", "STDOUT", "STDERR", "COMMAND")]
        for p in procs:
            code = "-" if p.exited is None else (p.exited.signal or str(p.exited.exit_code))
            rows.append(
                (
                    p.process_id,
                    p.state,
                    code,
                    _when(p.started_at),
                    str(p.stdout_bytes),
                    str(p.stderr_bytes),
                    " ".join(p.argv),
                )
            )
        return _table(rows)

    _emit(args, procs, text)
    return 0


async def cmd_attach(client: SandboxClient, args: argparse.Namespace) -> int:
    session = client.session(args.session)
    events = session.attach(
        args.process, stdout_offset=args.stdout_offset, stderr_offset=args.stderr_offset
    )
    return await _follow(args, events)


async def cmd_kill(client: SandboxClient, args: argparse.Namespace) -> int:
    await client.session(args.session).signal_process(args.process, args.signal)
    _emit(args, {"process_id": args.process, "signal": args.signal}, "")
    return 0


# ---- files -------------------------------------------------------------------------------------


def _split_remote(spec: str) -> tuple[str, str] | None:
    """`SESSION:path` -> (session, path); a local path (no colon before any slash) -> None."""
    head, sep, tail = spec.partition(":")
    if not sep or "/" in head or not head:
        return None
    return head, tail


async def cmd_cp(client: SandboxClient, args: argparse.Namespace) -> int:
    src, dst = _split_remote(args.src), _split_remote(args.dst)
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    if src is None and dst is not None:
        return await _upload(args, client.session(dst[0]), Path(args.src), dst[1], show)
    if src is not None and dst is None:
        return await _download(args, client.session(src[0]), src[1], Path(args.dst), show)
    raise SystemExit("sandboxctl: cp copies between a local path and SESSION:path")


async def _upload(
    args: argparse.Namespace, session: Session, local: Path, path: str, show: bool
) -> int:
    """Tar `local` (a file or a folder, under its own name) and stream it into `path`."""
    if not local.exists():
        raise SystemExit(f"sandboxctl: {local}: no such file or directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(local, arcname=local.resolve().name, filter=_portable)
    data = buf.getvalue()
    progress = Progress(f"{local} -> {session.id}:{path or '.'}", len(data), sys.stderr, show)

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(data), _CHUNK):
            piece = data[i : i + _CHUNK]
            yield piece
            progress.add(len(piece))

    try:
        done = await session.import_archive(chunks(), path)
    finally:
        progress.finish()  # ends the bar's line, so an error prints on a line of its own
    if _json(args):
        _emit(args, done, "")
    else:
        print(f"{done.files} files, {done.bytes} bytes", file=sys.stderr)
    return 0


def _portable(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Members without local owners or special bits: the server refuses setuid and devices."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode &= 0o777
    return info


async def _download(
    args: argparse.Namespace, session: Session, path: str, local: Path, show: bool
) -> int:
    """Stream a tar of the folder `path`; unpack it as `local`, or into it when it exists.

    Like `docker cp`: an existing local folder receives the remote one under its own name;
    otherwise `local` is created with the remote folder's contents.
    """
    progress = Progress(f"{session.id}:{path or '.'} -> {local}", None, sys.stderr, show)
    buf = io.BytesIO()
    try:
        async for data in session.export_archive(path):
            buf.write(data)
            progress.add(len(data))
    finally:
        progress.finish()
    buf.seek(0)
    name = PurePosixPath(path).name
    if local.is_dir() and name not in ("", ".", ".."):
        local = local / name
    local.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=buf, mode="r:") as tar:
        tar.extractall(local, filter="data")  # refuses absolute paths, `..` and links out
    _emit(args, {"path": str(local), "bytes": progress.done}, "")
    return 0


# ---- snapshots ---------------------------------------------------------------------------------


def _snapshot_rows(snaps: Sequence[Any]) -> str:
    rows = [("SNAPSHOT", "SESSION", "KIND", "SIZE", "CREATED", "LABELS")]
    for s in snaps:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        rows.append(
            (s.snapshot_id, s.session_id, s.kind, str(s.size_bytes), _when(s.created_at), labels)
        )
    return _table(rows)


async def cmd_snapshot_create(client: SandboxClient, args: argparse.Namespace) -> int:
    snap = await client.session(args.session).snapshot(
        kind=args.kind or "", labels=_pairs(args.label, "--label")
    )
    _emit(args, snap, snap.snapshot_id)
    return 0


async def cmd_snapshot_ls(client: SandboxClient, args: argparse.Namespace) -> int:
    snaps = [s async for s in client.list_snapshots(args.session or "")]
    _emit(args, snaps, lambda: _snapshot_rows(snaps))
    return 0


async def cmd_snapshot_get(client: SandboxClient, args: argparse.Namespace) -> int:
    snap = await client.get_snapshot(args.snapshot)
    _emit(args, snap, lambda: _snapshot_rows([snap]))
    return 0


async def cmd_snapshot_rm(client: SandboxClient, args: argparse.Namespace) -> int:
    for snap in args.snapshots:
        await client.delete_snapshot(snap)
    _emit(args, {"deleted": list(args.snapshots)}, "\n".join(args.snapshots))
    return 0


async def cmd_snapshot_download(client: SandboxClient, args: argparse.Namespace) -> int:
    size = 0
    with open(args.file, "wb") as f:
        async for data in client.download_snapshot(args.snapshot):
            f.write(data)
            size += len(data)
    _emit(args, {"path": args.file, "bytes": size}, f"{size} bytes -> {args.file}")
    return 0


async def cmd_completion(client: SandboxClient | None, args: argparse.Namespace) -> int:
    print(completion_script(build_parser(), args.shell))
    return 0


# ---- main --------------------------------------------------------------------------------------


def _session_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", help="caller-chosen session id (makes create idempotent)")
    p.add_argument("--allow", action="append", metavar="CMD", help="allow a command (repeat)")
    p.add_argument("--allow-all", action="store_true", help="allow every command")
    p.add_argument("--label", action="append", metavar="KEY=VALUE")
    p.add_argument("--env", action="append", metavar="KEY=VALUE")
    p.add_argument("--file", action="append", metavar="REMOTE=LOCAL", help="declare a file")
    p.add_argument("--image")
    p.add_argument("--user", help="numeric uid:gid")
    p.add_argument("--lease", type=float, metavar="SECONDS")
    p.add_argument("--json", action="store_true", help="same as -o json")


def _command_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cwd")
    p.add_argument("--env", action="append", metavar="KEY=VALUE")
    p.add_argument("-t", "--timeout", type=float, metavar="SECONDS", help="command timeout")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandboxctl", description="Run commands in sandboxd sessions."
    )
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
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Callable[..., Any], help: str, **kw: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, **kw)
        p.set_defaults(func=func)
        return p

    _session_options(add("create", cmd_create, "create a session and print its id"))
    p = add("fork", cmd_create, "create a session from a snapshot")
    p.add_argument("snapshot")
    _session_options(p)
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

    p = add("exec", cmd_exec, "run a command, streaming its output: exec SESSION -- CMD ...")
    p.add_argument("session")
    _command_options(p)
    p.add_argument("-i", "--stdin", action="store_true", help="send local stdin to the command")
    p.add_argument("-v", "--verbose", action="store_true")
    p = add("shell", cmd_shell, "an interactive terminal: shell SESSION [-- CMD ...] (sh)")
    p.add_argument("session")
    p.add_argument("--env", action="append", metavar="KEY=VALUE")
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

    p = add("completion", cmd_completion, "print a shell completion script")
    p.add_argument("shell", choices=("bash", "zsh"))
    return parser


async def _main(args: argparse.Namespace) -> int:
    func: Callable[..., Any] = args.func
    if func is cmd_completion:
        return await cmd_completion(None, args)
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
    args = build_parser().parse_args(argv[:split])
    args.argv = argv[split + 1 :]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        return asyncio.run(_main(args))
    except SandboxError as err:
        if _json(args):
            error = {"reason": err.reason, "message": err.message, "code": err.code.name}
            print(json.dumps({"error": error | {"metadata": err.metadata}}), file=sys.stderr)
        else:
            print(f"sandboxctl: {err.reason}: {err.message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
