"""sandboxctl snapshot: create, ls, get, rm, download."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sandboxd_client.cli_output import emit, pairs, table, when

if TYPE_CHECKING:  # imported when a command runs: the parser needs none of them
    from sandboxd_client.client import SandboxClient


def _snapshot_rows(snaps: Sequence[Any]) -> str:
    rows = [("SNAPSHOT", "SESSION", "KIND", "SIZE", "CREATED", "LABELS")]
    for s in snaps:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        rows.append(
            (s.snapshot_id, s.session_id, s.kind, str(s.size_bytes), when(s.created_at), labels)
        )
    return table(rows)


async def cmd_snapshot_create(client: SandboxClient, args: argparse.Namespace) -> int:
    snap = await client.session(args.session).snapshot(
        kind=args.kind or "", labels=pairs(args.label, "--label")
    )
    emit(args, snap, snap.snapshot_id)
    return 0


async def cmd_snapshot_ls(client: SandboxClient, args: argparse.Namespace) -> int:
    snaps = [s async for s in client.list_snapshots(args.session or "")]
    emit(args, snaps, lambda: _snapshot_rows(snaps))
    return 0


async def cmd_snapshot_get(client: SandboxClient, args: argparse.Namespace) -> int:
    snap = await client.get_snapshot(args.snapshot)
    emit(args, snap, lambda: _snapshot_rows([snap]))
    return 0


async def cmd_snapshot_rm(client: SandboxClient, args: argparse.Namespace) -> int:
    for snap in args.snapshots:
        await client.delete_snapshot(snap)
    emit(args, {"deleted": list(args.snapshots)}, "\n".join(args.snapshots))
    return 0


async def cmd_snapshot_download(client: SandboxClient, args: argparse.Namespace) -> int:
    size = 0
    with open(args.file, "wb") as f:
        async for data in client.download_snapshot(args.snapshot):
            f.write(data)
            size += len(data)
    emit(args, {"path": args.file, "bytes": size}, f"{size} bytes -> {args.file}")
    return 0
