"""sandboxctl: sandboxd from a terminal.

    sandboxctl create --allow sh --allow echo --label owner=me
    sandboxctl exec SESSION -- sh -c 'echo hi'     # live output; exits with the remote code
    sandboxctl cp ./src SESSION:                    # tar upload (as src/), progress bar
    sandboxctl cp SESSION:out ./out                 # tar download
    sandboxctl ls --label owner=me
    sandboxctl info [SESSION]
    sandboxctl rm SESSION...

The server is `--addr` or $SANDBOXD_ADDR (default 127.0.0.1:50051); a bearer token is
`--token` or $SANDBOXD_TOKEN. A failed call prints the server's reason and exits 1; `exec`
otherwise exits with the remote command's exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import tarfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import IO, Any

from google.protobuf import json_format

from sandboxd_client.client import TLS, Exited, Output, SandboxClient, Session, Started
from sandboxd_client.errors import SandboxError

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


def _json(message: Any) -> str:
    return json_format.MessageToJson(message, indent=2, preserving_proto_field_name=True)


# ---- progress ----------------------------------------------------------------------------------


class Progress:
    """A one-line byte counter on stderr, redrawn at most ten times a second."""

    def __init__(self, label: str, total: int | None, stream: IO[str], enabled: bool) -> None:
        self.label, self.total, self.stream, self.enabled = label, total, stream, enabled
        self.done = 0
        self._last = 0.0

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self._last >= 0.1:
            self._last = now
            self._draw()

    def finish(self) -> None:
        if self.enabled:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self) -> None:
        if self.total:
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            text = f"{self.label} [{bar:<30}] {_size(self.done)}/{_size(self.total)}"
        else:
            text = f"{self.label} {_size(self.done)}"
        self.stream.write("\r" + text)
        self.stream.flush()


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{n}B"  # pragma: no cover


# ---- commands ----------------------------------------------------------------------------------


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
    )
    print(_json(session.info) if args.json else session.id)
    return 0


async def cmd_ls(client: SandboxClient, args: argparse.Namespace) -> int:
    sessions = [s async for s in client.list_sessions(_pairs(args.label, "--label"))]
    if args.json:
        print(json.dumps([json.loads(_json(s.info)) for s in sessions], indent=2))
        return 0
    rows = [("SESSION", "STATE", "IMAGE", "LEASE EXPIRES", "LABELS")]
    for s in sessions:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        expires = s.lease_expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        rows.append((s.id, s.state, s.info.image, expires, labels))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


async def cmd_exec(client: SandboxClient, args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise SystemExit("sandboxctl: exec needs a command: sandboxctl exec SESSION -- CMD ...")
    stdin = sys.stdin.buffer.read() if args.stdin else b""
    out, err = sys.stdout.buffer, sys.stderr.buffer
    session = client.session(args.session)
    exit_code = EXIT_ERROR
    async for event in session.exec(
        argv, cwd=args.cwd or "", env=_pairs(args.env, "--env"), stdin=stdin, timeout=args.timeout
    ):
        if isinstance(event, Output):
            target = err if event.stream == "stderr" else out
            target.write(event.data)
            target.flush()  # live: a line shows as soon as the command prints it
        elif isinstance(event, Exited):
            exit_code = event.exit_code
            if event.timed_out:
                print("sandboxctl: command timed out", file=sys.stderr)
            if event.truncated:
                print("sandboxctl: output over the cap; command killed", file=sys.stderr)
        elif isinstance(event, Started) and args.verbose:
            print(f"sandboxctl: started {event.process_id}", file=sys.stderr)
    return exit_code


async def cmd_rm(client: SandboxClient, args: argparse.Namespace) -> int:
    for sid in args.sessions:
        await client.session(sid).delete()
        print(sid)
    return 0


async def cmd_info(client: SandboxClient, args: argparse.Namespace) -> int:
    if args.session:
        print(_json((await client.get_session(args.session)).info))
    else:
        print(_json(await client.server_info()))
    return 0


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
        return await _upload(client.session(dst[0]), Path(args.src), dst[1], show)
    if src is not None and dst is None:
        return await _download(client.session(src[0]), src[1], Path(args.dst), show)
    raise SystemExit("sandboxctl: cp copies between a local path and SESSION:path")


async def _upload(session: Session, local: Path, path: str, show: bool) -> int:
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
    print(f"{done.files} files, {done.bytes} bytes", file=sys.stderr)
    return 0


def _portable(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Members without local owners or special bits: the server refuses setuid and devices."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode &= 0o777
    return info


async def _download(session: Session, path: str, local: Path, show: bool) -> int:
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
    return 0


# ---- main --------------------------------------------------------------------------------------


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
        "--token",
        default=os.environ.get("SANDBOXD_TOKEN") or None,
        help="bearer token ($SANDBOXD_TOKEN)",
    )
    parser.add_argument("--tls", action="store_true", help="use TLS with the system roots")
    parser.add_argument("--ca", type=Path, help="PEM file of the CA to trust (implies --tls)")
    parser.add_argument(
        "--call-timeout", type=float, metavar="SECONDS", help="deadline of each unary call"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("create", help="create a session and print its id")
    p.add_argument("--id", help="caller-chosen session id (makes create idempotent)")
    p.add_argument("--allow", action="append", metavar="CMD", help="allow a command (repeat)")
    p.add_argument("--allow-all", action="store_true", help="allow every command")
    p.add_argument("--label", action="append", metavar="KEY=VALUE")
    p.add_argument("--env", action="append", metavar="KEY=VALUE")
    p.add_argument("--file", action="append", metavar="REMOTE=LOCAL", help="declare a file")
    p.add_argument("--image")
    p.add_argument("--user", help="numeric uid:gid")
    p.add_argument("--lease", type=float, metavar="SECONDS")
    p.add_argument("--json", action="store_true", help="print the whole session")
    p.set_defaults(func=cmd_create)

    p = sub.add_parser("ls", help="list sessions")
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help="filter (repeat)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("exec", help="run a command, streaming its output")
    p.add_argument("session")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- CMD ARG...")
    p.add_argument("--cwd")
    p.add_argument("--env", action="append", metavar="KEY=VALUE")
    p.add_argument("-i", "--stdin", action="store_true", help="send local stdin to the command")
    p.add_argument("-t", "--timeout", type=float, metavar="SECONDS", help="command timeout")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_exec)

    p = sub.add_parser(
        "cp",
        help="copy in or out via tar (SESSION:path)",
        description="LOCAL SESSION:DIR puts LOCAL (a file or folder) into DIR under its own name; "
        "SESSION:DIR LOCAL copies the folder DIR (empty: the workspace) to LOCAL, or into it "
        "under DIR's name when LOCAL is an existing folder.",
    )
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--progress", action="store_true", default=None, help="always show progress")
    p.add_argument("--no-progress", action="store_false", dest="progress")
    p.set_defaults(func=cmd_cp)

    p = sub.add_parser("rm", help="delete sessions")
    p.add_argument("sessions", nargs="+")
    p.set_defaults(func=cmd_rm)

    p = sub.add_parser("info", help="server information, or one session's")
    p.add_argument("session", nargs="?")
    p.set_defaults(func=cmd_info)
    return parser


async def _main(args: argparse.Namespace) -> int:
    tls = None
    if args.tls or args.ca:
        tls = TLS(root_certificates=args.ca.read_bytes() if args.ca else None)
    timeout = args.call_timeout
    async with SandboxClient(args.addr, token=args.token, tls=tls, timeout=timeout) as c:
        func: Callable[[SandboxClient, argparse.Namespace], Any] = args.func
        result: int = await func(c, args)
        return result


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(_main(args))
    except SandboxError as err:
        print(f"sandboxctl: {err.reason}: {err.message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
