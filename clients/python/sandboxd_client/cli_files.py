"""sandboxctl cp: tar streamed in and out of a session, with a progress bar."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from sandboxd_client.cli_output import emit, wants_json

if TYPE_CHECKING:  # imported when a command runs: the parser needs none of them
    from sandboxd_client.client import SandboxClient
    from sandboxd_client.session import Session


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
    """Tar `local` (a file or a folder, under its own name) and stream it into `path`, made as
    it is sent (nothing whole in memory)."""
    # tarfile and the progress bar load for cp alone: every other command starts without them
    from sandboxd_client.cli_progress import Progress
    from sandboxd_client.tar_stream import estimated_size, tar_chunks

    if not local.exists():
        raise SystemExit(f"sandboxctl: {local}: no such file or directory")
    total = estimated_size(local) if local.is_dir() else local.stat().st_size + 1536
    progress = Progress(f"{local} -> {session.id}:{path or '.'}", total, sys.stderr, show)
    chunks = tar_chunks(local, arcname=local.resolve().name, progress=lambda n, _: progress.to(n))
    try:
        done = await session.import_archive(chunks, path)
    finally:
        progress.finish()  # ends the bar's line, so an error prints on a line of its own
    if wants_json(args):
        emit(args, done, "")
    else:
        print(f"{done.files} files, {done.bytes} bytes", file=sys.stderr)
    return 0


async def _download(
    args: argparse.Namespace, session: Session, path: str, local: Path, show: bool
) -> int:
    """Stream a tar of the folder `path`; unpack it as `local`, or into it when it exists, as
    it arrives.

    Like `docker cp`: an existing local folder receives the remote one under its own name;
    otherwise `local` is created with the remote folder's contents.
    """
    from sandboxd_client.cli_progress import Progress
    from sandboxd_client.tar_stream import untar_chunks

    progress = Progress(f"{session.id}:{path or '.'} -> {local}", None, sys.stderr, show)
    name = PurePosixPath(path).name
    if local.is_dir() and name not in ("", ".", ".."):
        local = local / name
    try:
        size = await untar_chunks(
            session.export_archive(path), local, progress=lambda n, _: progress.to(n)
        )
    finally:
        progress.finish()
    emit(args, {"path": str(local), "bytes": size}, "")
    return 0


# ---- snapshots ---------------------------------------------------------------------------------
