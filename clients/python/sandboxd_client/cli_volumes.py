"""sandboxctl volume: create, ls, get, rm, export, import; and `--volume ID:PATH[:ro]` for
create, run and shell --new."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator, Sequence
from typing import IO, TYPE_CHECKING, Any

from sandboxd_client.cli_output import emit, pairs, table, when

if TYPE_CHECKING:  # imported when a command runs: the parser needs none of them
    from sandboxd_client.client import SandboxClient
    from sandboxd_client.volumes import Volume, VolumeMount

CHUNK = 256 * 1024


def volume_mounts(specs: Sequence[str] | None) -> list[VolumeMount]:
    """`--volume ID:PATH[:ro]` options as mounts (the server checks the path)."""
    from sandboxd_client.volumes import VolumeMount

    mounts = []
    for spec in specs or ():
        volume_id, sep, rest = spec.partition(":")
        path, _, mode = rest.partition(":")
        if not sep or not volume_id or not path or mode not in ("", "ro", "rw"):
            raise SystemExit(f"sandboxctl: --volume must be ID:PATH[:ro], got {spec!r}")
        mounts.append(VolumeMount(volume_id, path, read_only=mode == "ro"))
    return mounts


def _rows(found: Sequence[Volume]) -> str:
    rows: list[tuple[Any, ...]] = [("VOLUME", "SIZE", "USED", "CREATED", "ATTACHED", "LABELS")]
    for v in found:
        attached = ",".join(f"{s}{'(ro)' if ro else ''}" for s, ro in v.attached)
        labels = ",".join(f"{k}={val}" for k, val in sorted(v.labels.items()))
        rows.append(
            (
                v.volume_id,
                str(v.size_bytes),
                str(v.used_bytes),
                when(v.created_at),
                attached,
                labels,
            )
        )
    return table(rows)


async def cmd_volume_create(client: SandboxClient, args: argparse.Namespace) -> int:
    v = await client.create_volume(
        args.volume or "", size_bytes=args.size or 0, labels=pairs(args.label, "--label")
    )
    emit(args, v, v.volume_id)
    return 0


async def cmd_volume_ls(client: SandboxClient, args: argparse.Namespace) -> int:
    found = [v async for v in client.list_volumes(labels=pairs(args.label, "--label"))]
    emit(args, found, lambda: _rows(found))
    return 0


async def cmd_volume_get(client: SandboxClient, args: argparse.Namespace) -> int:
    v = await client.get_volume(args.volume)
    emit(args, v, lambda: _rows([v]))
    return 0


async def cmd_volume_rm(client: SandboxClient, args: argparse.Namespace) -> int:
    for volume_id in args.volumes:
        await client.delete_volume(volume_id)
    emit(args, {"deleted": list(args.volumes)}, "\n".join(args.volumes))
    return 0


async def cmd_volume_export(client: SandboxClient, args: argparse.Namespace) -> int:
    size = 0
    out: IO[bytes] = sys.stdout.buffer if args.file == "-" else open(args.file, "wb")  # noqa: SIM115
    try:
        async for data in client.export_volume(args.volume):
            await asyncio.to_thread(out.write, data)
            size += len(data)
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    if args.file != "-":
        emit(args, {"path": args.file, "bytes": size}, f"{size} bytes -> {args.file}")
    return 0


async def _chunks(f: IO[bytes]) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(f.read, CHUNK):
        yield chunk


async def cmd_volume_import(client: SandboxClient, args: argparse.Namespace) -> int:
    src: IO[bytes] = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
    try:
        v = await client.import_volume(args.volume, _chunks(src), replace=args.replace)
    finally:
        if src is not sys.stdin.buffer:
            src.close()
    emit(args, v, v.volume_id)
    return 0


def add_volume_commands(sub: Any) -> None:
    volume = sub.add_parser("volume", help="volumes: create, ls, get, rm, export, import")
    vsub = volume.add_subparsers(dest="volume_command", required=True)
    p = vsub.add_parser("create", help="create a volume, print its id")
    p.set_defaults(func=cmd_volume_create)
    p.add_argument("volume", nargs="?", help="its id (default: the server names it)")
    p.add_argument("--size", type=int, metavar="BYTES", help="default: the server's")
    p.add_argument("--label", action="append", metavar="KEY=VALUE")
    p = vsub.add_parser("ls", help="list your volumes")
    p.set_defaults(func=cmd_volume_ls)
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help="filter (repeat)")
    p = vsub.add_parser("get", help="one volume, its usage measured now")
    p.set_defaults(func=cmd_volume_get)
    p.add_argument("volume")
    p = vsub.add_parser("rm", help="delete volumes (refused while a live session mounts one)")
    p.set_defaults(func=cmd_volume_rm)
    p.add_argument("volumes", nargs="+")
    p = vsub.add_parser("export", help="the volume as a tar, to FILE (- for stdout)")
    p.set_defaults(func=cmd_volume_export)
    p.add_argument("volume")
    p.add_argument("file")
    p = vsub.add_parser("import", help="unpack a tar from FILE (- for stdin) into the volume")
    p.set_defaults(func=cmd_volume_import)
    p.add_argument("volume")
    p.add_argument("file")
    p.add_argument("--replace", action="store_true", help="empty the volume first")
