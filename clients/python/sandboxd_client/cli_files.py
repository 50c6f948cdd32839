"""sandboxctl cp: tar streamed in and out of a session, with a progress bar."""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath

from sandboxd_client.cli_output import emit, wants_json
from sandboxd_client.cli_progress import Progress
from sandboxd_client.client import SandboxClient
from sandboxd_client.session import Session

_CHUNK = 256 * 1024


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
    if wants_json(args):
        emit(args, done, "")
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
    emit(args, {"path": str(local), "bytes": progress.done}, "")
    return 0


# ---- snapshots ---------------------------------------------------------------------------------
